#!/usr/bin/env python3
"""HF transformers' own loading of a model, from a GGUF file (which dequantizes and undoes
llama.cpp's Q/K permutation) or from an HF directory: its config and an XXH3-64 digest of every
state_dict tensor, as float32 and as bfloat16 (round to nearest even).

  model_reference.py GGUF_OR_DIR > reference.json
"""
import json
import os
import sys

import numpy as np
import torch
import xxhash
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dequantize_reference import to_bf16  # noqa: E402


def main(path):
    if os.path.isdir(path):
        model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path) or ".",
                                                     gguf_file=os.path.basename(path),
                                                     torch_dtype=torch.float32)
    cfg = model.config
    out = {"config": {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
                      "intermediate_size": cfg.intermediate_size,
                      "num_hidden_layers": cfg.num_hidden_layers,
                      "num_attention_heads": cfg.num_attention_heads,
                      "num_key_value_heads": cfg.num_key_value_heads,
                      "rope_theta": float(cfg.rope_theta), "rms_norm_eps": float(cfg.rms_norm_eps),
                      "tie_word_embeddings": bool(cfg.tie_word_embeddings)},
           "tensors": {}}
    with torch.no_grad():
        for name, t in model.state_dict().items():
            values = t.detach().to(torch.float32).contiguous().numpy().reshape(-1)
            out["tensors"][name] = {
                "shape": list(t.shape),
                "f32": "%016x" % xxhash.xxh3_64_intdigest(values.tobytes()),
                "bf16": "%016x" % xxhash.xxh3_64_intdigest(to_bf16(values).tobytes())}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
