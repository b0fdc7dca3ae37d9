#!/usr/bin/env bash
# Table-driven loading errors: small GGUF files written by the gguf package and HF directories
# (config.json + safetensors written by the safetensors package), each broken in one way, must
# fail to load with a clear error naming the problem; the intact ones must load.
set -euo pipefail
loader="$1"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
t="${TEST_TMPDIR}"
"${FERRY_REF_PYTHON}" - "${t}" <<'PY'
import sys
import numpy as np
import gguf
out = sys.argv[1]
V, H, F, L, NH, NKV = 64, 32, 64, 2, 4, 2
D = H // NH
def tensors(skip=None, extra=None, bad_shape=None, qtype=None):
    rng = np.random.default_rng(0)
    ts = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    for l in range(L):
        for name, shape in [("attn_norm", (H,)), ("ffn_norm", (H,)), ("attn_q", (NH * D, H)),
                            ("attn_k", (NKV * D, H)), ("attn_v", (NKV * D, H)),
                            ("attn_output", (H, NH * D)), ("ffn_gate", (F, H)), ("ffn_up", (F, H)),
                            ("ffn_down", (H, F))]:
            ts[f"blk.{l}.{name}.weight"] = shape
    if skip: del ts[skip]
    if extra: ts[extra] = (H,)
    if bad_shape: ts[bad_shape] = (ts[bad_shape][0] + 1,) + ts[bad_shape][1:]
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in ts.items()}
rng = np.random.default_rng(1)
def write(name, arch="llama", heads=NH, **kw):
    w = gguf.GGUFWriter(f"{out}/{name}.gguf", arch)
    w.add_block_count(L); w.add_embedding_length(H); w.add_feed_forward_length(F)
    w.add_head_count(heads); w.add_head_count_kv(NKV); w.add_context_length(128)
    w.add_layer_norm_rms_eps(1e-5); w.add_rope_freq_base(10000.0)
    w.add_token_list([f"t{i}" for i in range(V)])
    qtype = kw.pop("qtype", None)
    for k, v in tensors(**kw).items():
        if qtype == gguf.GGMLQuantizationType.I8 and v.ndim == 2:
            w.add_tensor(k, rng.integers(-128, 128, v.shape, dtype=np.int8))
        elif qtype is not None and v.ndim == 2:
            w.add_tensor(k, gguf.quants.quantize(v, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(k, v)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
write("good")
write("good_q8", qtype=gguf.GGMLQuantizationType.Q8_0)
write("arch", arch="gpt2")
write("missing", skip="blk.1.ffn_up.weight")
write("unexpected", extra="blk.0.attn_q.bias")
write("shape", bad_shape="blk.0.attn_k.weight")
write("heads", heads=3)
write("good_q5", qtype=gguf.GGMLQuantizationType.Q5_1)
write("i8_unsupported", qtype=gguf.GGMLQuantizationType.I8)
# Mixtral-style experts (4 of width F, 2 per token): 3-D tensors, experts outermost.
def write_moe(name, file_experts=4, used=2):
    w = gguf.GGUFWriter(f"{out}/{name}.gguf", "llama")
    w.add_block_count(L); w.add_embedding_length(H); w.add_feed_forward_length(F)
    w.add_head_count(NH); w.add_head_count_kv(NKV); w.add_context_length(128)
    w.add_layer_norm_rms_eps(1e-5); w.add_rope_freq_base(10000.0)
    w.add_expert_count(4); w.add_expert_used_count(used)
    w.add_token_list([f"t{i}" for i in range(V)])
    for k, v in tensors().items():
        if k.split(".")[-2] in ("ffn_gate", "ffn_up", "ffn_down"):
            continue
        w.add_tensor(k, v)
    for l in range(L):
        w.add_tensor(f"blk.{l}.ffn_gate_inp.weight", rng.standard_normal((4, H)).astype(np.float32))
        for n, shape in (("ffn_gate_exps", (F, H)), ("ffn_up_exps", (F, H)), ("ffn_down_exps", (H, F))):
            e = file_experts if (l, n) == (1, "ffn_up_exps") else 4
            data = rng.standard_normal((e,) + shape).astype(np.float32)
            w.add_tensor(f"blk.{l}.{n}.weight",
                         gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
write_moe("moe_good")
write_moe("moe_experts", file_experts=3)
write_moe("moe_used", used=5)
PY
head -c 1000 "${t}/good.gguf" >"${t}/truncated.gguf"
"${FERRY_REF_PYTHON}" - "${t}" <<'PY'
import json, os, shutil, sys
import numpy as np
from safetensors.numpy import save_file
out = sys.argv[1]
V, H, F, L, NH, NKV = 64, 32, 64, 2, 4, 2
D = H // NH
def config(**kw):
    c = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V,
         "hidden_size": H, "intermediate_size": F, "num_hidden_layers": L,
         "num_attention_heads": NH, "num_key_value_heads": NKV, "max_position_embeddings": 128,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}
    c.update(kw)
    return c
def tensors(dtype=np.float32):
    rng = np.random.default_rng(0)
    ts = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for l in range(L):
        p = f"model.layers.{l}."
        for name, shape in [("input_layernorm", (H,)), ("post_attention_layernorm", (H,)),
                            ("self_attn.q_proj", (NH * D, H)), ("self_attn.k_proj", (NKV * D, H)),
                            ("self_attn.v_proj", (NKV * D, H)), ("self_attn.o_proj", (H, NH * D)),
                            ("mlp.gate_proj", (F, H)), ("mlp.up_proj", (F, H)),
                            ("mlp.down_proj", (H, F))]:
            ts[p + name + ".weight"] = shape
    return {k: rng.standard_normal(s).astype(dtype) for k, s in ts.items()}
TOKENIZER = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
             "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
             "trim_offsets": True, "use_regex": True}, "post_processor": None,
             "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
             "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                       "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                       "ignore_merges": False, "vocab": {chr(0x100 + i) if i < 33 else chr(i): i for i in range(V)}, "merges": []}}
def write(name, cfg=None, ts=None, raw_config=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    if raw_config is not None:
        open(os.path.join(d, "config.json"), "w").write(raw_config)
    elif cfg is not False:
        json.dump(cfg or config(), open(os.path.join(d, "config.json"), "w"))
    json.dump(TOKENIZER, open(os.path.join(d, "tokenizer.json"), "w"))
    if ts is not False:
        save_file(ts if ts is not None else tensors(), os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})
    return d
write("hf_good")
write("hf_no_config", cfg=False)
write("hf_bad_json", raw_config="{\"model_type\": \"llama\",")
write("hf_arch", cfg=config(model_type="gpt2"))
write("hf_rope", cfg=config(rope_scaling={"rope_type": "yarn", "factor": 4.0}))
write("hf_heads", cfg=config(num_attention_heads=3))
ts = tensors(); del ts["model.layers.1.mlp.up_proj.weight"]; write("hf_missing", ts=ts)
ts = tensors(); ts["model.layers.0.self_attn.q_proj.bias"] = np.zeros(H, np.float32); write("hf_unexpected", ts=ts)
ts = tensors(); ts["model.layers.0.self_attn.k_proj.weight"] = np.zeros((NKV * D + 1, H), np.float32); write("hf_shape", ts=ts)
ts = tensors(); ts["model.norm.weight"] = np.zeros(H, np.int32); write("hf_dtype", ts=ts)
write("hf_no_weights", ts=False)
d = write("hf_truncated")
data = open(os.path.join(d, "model.safetensors"), "rb").read()
open(os.path.join(d, "model.safetensors"), "wb").write(data[:len(data) // 2])
d = write("hf_bad_header")
open(os.path.join(d, "model.safetensors"), "wb").write((10**9).to_bytes(8, "little") + b"{}")
d = write("hf_missing_shard", ts=False)
json.dump({"metadata": {}, "weight_map": {k: "model-00001-of-00002.safetensors" for k in tensors()}},
          open(os.path.join(d, "model.safetensors.index.json"), "w"))
# LLaVA directories: the text model under text_config (the fields equal to LlamaConfig's
# defaults left out, as save_pretrained writes them) and under language_model.*; the tower's and
# projector's tensors are the VisionTower's, skipped here.
def llava(text=None, **kw):
    t = {"model_type": "llama", "vocab_size": V, "hidden_size": H, "intermediate_size": F,
         "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": NKV}
    if text: t.update(text)
    c = {"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
         "image_token_index": V - 1, "text_config": t}
    c.update(kw)
    return c
def llava_tensors(extra=None, bias=False):
    ts = {"language_model." + k: v for k, v in tensors().items()}
    for l in range(L) if bias else []:  # Qwen2's q/k/v biases
        for name, n in [("q_proj", NH * D), ("k_proj", NKV * D), ("v_proj", NKV * D)]:
            ts[f"language_model.model.layers.{l}.self_attn.{name}.bias"] = np.ones(n, np.float32)
    ts["vision_tower.vision_model.post_layernorm.weight"] = np.ones(8, np.float32)
    ts["multi_modal_projector.linear_1.weight"] = np.ones((H, 8), np.float32)
    if extra: ts[extra] = np.ones(4, np.float32)
    return ts
write("hf_llava_good", cfg=llava(), ts=llava_tensors())
write("hf_llava_no_text", cfg={"model_type": "llava"}, ts=llava_tensors())
write("hf_llava_qwen3", cfg=llava(text={"model_type": "qwen3"}), ts=llava_tensors())
# Qwen2 text: the window on the layers from max_window_layers on (both defaults apply when left
# out: max_window_layers 28, so no window on 2 layers; num_key_value_heads 32).
qwen2 = {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 8}
write("hf_llava_qwen2_hybrid", cfg=llava(text=dict(qwen2, max_window_layers=1)),
      ts=llava_tensors(bias=True))
write("hf_llava_qwen2_no_window", cfg=llava(text=qwen2), ts=llava_tensors(bias=True))
c = llava(text={"model_type": "qwen2"}); del c["text_config"]["num_key_value_heads"]
write("hf_llava_qwen2_kv_heads", cfg=c, ts=llava_tensors(bias=True))
write("hf_llava_qwen2_no_bias", cfg=llava(text=qwen2), ts=llava_tensors())
write("hf_llava_stray", cfg=llava(), ts=llava_tensors(extra="model.norm.bias"))
write("hf_llava_flat", cfg=llava(), ts=tensors())
PY
"${loader}" "${t}"
