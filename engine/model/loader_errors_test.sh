#!/usr/bin/env bash
# Table-driven loading errors: small GGUF files written by the gguf package, each broken in one
# way, must fail to load with a clear error naming the problem; the intact one must load.
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
def write(name, arch="llama", heads=NH, **kw):
    w = gguf.GGUFWriter(f"{out}/{name}.gguf", arch)
    w.add_block_count(L); w.add_embedding_length(H); w.add_feed_forward_length(F)
    w.add_head_count(heads); w.add_head_count_kv(NKV); w.add_context_length(128)
    w.add_layer_norm_rms_eps(1e-5); w.add_rope_freq_base(10000.0)
    w.add_token_list([f"t{i}" for i in range(V)])
    qtype = kw.pop("qtype", None)
    for k, v in tensors(**kw).items():
        if qtype is not None and v.ndim == 2:
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
write("q5_0_unsupported", qtype=gguf.GGMLQuantizationType.Q5_0)
PY
head -c 1000 "${t}/good.gguf" >"${t}/truncated.gguf"
"${loader}" "${t}"
