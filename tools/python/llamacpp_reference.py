#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) as the reference for Ferry's block-format (--weights native) path:
the same GGUF file, the same token ids.

  llamacpp_reference.py logits MODEL.gguf CASES.json OUT_DIR [--kv f16|f32]
      For each prompt i of CASES.json ({"prompts": [[ids], ...]}), the logits of every position
      (logits_all) from one llama_decode of the whole prompt, as OUT_DIR/logits_{i}.f32 (rows of
      n_vocab float32), the layout forward_check reads.

  llamacpp_reference.py generate MODEL.gguf CASES.json OUT.json --max-new-tokens N [--kv f16|f32]
      Greedy decoding of N tokens after each prompt; OUT.json {"results": [{"tokens": [...],
      "margins": [...]}]}, margins[t] = top-1 minus top-2 logit at step t.

  llamacpp_reference.py quantize SRC.gguf DST.gguf --type q8_0|q4_0|q4_1|q5_0|q5_1|q4_k_m|q5_k_m|q6_k
      llama.cpp's own quantizer (llama_model_quantize) over SRC (a BF16 or F32 file).

Runs on the client venv (llama-cpp-python); the CPU backend, flash attention off (the library's
default), an f16 KV cache (its default) unless --kv f32.
"""
import argparse
import ctypes
import json
import os
import sys

import numpy as np


def quiet():
    import llama_cpp

    @llama_cpp.llama_log_callback
    def ignore(level, text, user_data):
        pass

    llama_cpp.llama_log_set(ignore, ctypes.c_void_p(0))
    quiet.keep = ignore  # the callback must outlive the call


def load(model, cases, logits_all, kv="f16"):
    import llama_cpp
    longest = max(len(c) for c in cases)
    kv_type = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[kv]
    return llama_cpp.Llama(model_path=model, n_ctx=max(512, longest + 64), n_batch=max(512, longest),
                           n_ubatch=max(512, longest), n_threads=os.cpu_count(),
                           n_threads_batch=os.cpu_count(), logits_all=logits_all, seed=0,
                           type_k=kv_type, type_v=kv_type, verbose=False)


def logits(args):
    cases = json.load(open(args.cases))["prompts"]
    llm = load(args.model, cases, True, args.kv)
    os.makedirs(args.out, exist_ok=True)
    for i, ids in enumerate(cases):
        llm.reset()
        llm.eval(ids)
        rows = np.ascontiguousarray(llm.scores[:len(ids)], dtype=np.float32)
        rows.tofile(os.path.join(args.out, f"logits_{i}.f32"))
    print(f"{len(cases)} prompts", file=sys.stderr)


def generate(args):
    import llama_cpp
    cases = json.load(open(args.cases))["prompts"]
    llm = load(args.model, cases, False, args.kv)
    n_vocab = llm.n_vocab()
    results = []
    for ids in cases:
        llm.reset()
        llm.eval(ids)
        tokens, margins = [], []
        for _ in range(args.max_new_tokens):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1),
                                        shape=(n_vocab,)).astype(np.float64)
            top2 = np.partition(row, -2)[-2:]
            token = int(row.argmax())
            tokens.append(token)
            margins.append(float(top2.max() - top2.min()))
            llm.eval([token])
        results.append({"tokens": tokens, "margins": margins})
    json.dump({"results": results}, open(args.out, "w"))


def quantize(args):
    import llama_cpp
    ftypes = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
              "q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1, "q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0,
              "q5_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1,
              "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
              "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
              "q6_k": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K}
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftypes[args.type]
    params.nthread = os.cpu_count()
    rc = llama_cpp.llama_model_quantize(args.src.encode(), args.dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("logits")
    run.add_argument("model")
    run.add_argument("cases")
    run.add_argument("out")
    run.add_argument("--kv", choices=["f16", "f32"], default="f16", help="the KV cache's type")
    gen = commands.add_parser("generate")
    gen.add_argument("model")
    gen.add_argument("cases")
    gen.add_argument("out")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument("--kv", choices=["f16", "f32"], default="f16", help="the KV cache's type")
    q = commands.add_parser("quantize")
    q.add_argument("src")
    q.add_argument("dst")
    q.add_argument("--type", required=True, choices=["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k"])
    args = parser.parse_args()
    quiet()
    {"logits": logits, "generate": generate, "quantize": quantize}[args.command](args)


if __name__ == "__main__":
    main()
