#!/usr/bin/env bash
# ferry bench engine [--threads N] [--no-peer]: Ferry's engine on SmolLM2-135M (bf16 weights and
# KV, CPU backend) against the machine's limits and against llama.cpp, all in this run:
#   - decode tokens/s at batch 1 and prefill tokens/s for a 1024-token prompt, and decode tokens/s
#     through the engine's scheduler at batch 1..64 (tools/bench/engine_bench.cc, which also
#     measures read bandwidth and peak FMA throughput);
#   - llama.cpp (llama-cpp-python, client venv) with the same thread count and the same prompt
#     ids, on the same weights at the same precision (a BF16 GGUF written from the default model's
#     tensors with `gguf`, made once per machine) with flash attention off (llama-cpp-python's
#     default) and on; the ratios are taken against the faster of the two, figure by figure; and
#     for reference on the original Q4_1 file; batched decode at 16 and 64 sequences (one context,
#     n_seq_max sequences, one llama_decode per step), flash attention off and on.
# --no-peer skips llama.cpp (the table and the JSON say so; the ratios are then null).
# --model moe measures a synthetic ~1.8 GB mixture of experts instead (64 experts, 4 per token,
# a gated shared expert): decode at batch 1 against the bytes it actually reads per token (the
# experts chosen, not all of them), decode at batch 64, and the tokens each expert received.
set -euo pipefail
bench_bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
peer="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
shift 2
: "${FERRY_REF_PYTHON:?run through ./ferry bench engine}"
: "${FERRY_CLIENT_PYTHON:?run through ./ferry bench engine}"
: "${FERRY_MODEL_GGUF:?run through ./ferry bench engine}"
threads=$(nproc)
with_peer=1
model=smollm2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --no-peer) with_peer=0; shift ;;
    --model) model="$2"; shift 2 ;;
    *) echo "usage: ferry bench engine [--threads N] [--no-peer] [--model smollm2|moe]" >&2; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

if [[ "${model}" == moe ]]; then
  echo "engine: Ferry on a synthetic mixture of experts, ${threads} threads..." >&2
  "${bench_bin}" - - --model moe --threads "${threads}" --decode-tokens 32 >"${work}/moe.json"
  "${FERRY_REF_PYTHON}" - "${work}/moe.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"engine --model moe: synthetic Qwen2-MoE-style model, {d['total_weight_bytes'] / 1e9:.2f} GB "
      f"of bf16 weights, {d['experts']} experts, {d['experts_per_token']} per token, {d['engine']}")
print(f"  machine: read bandwidth {d['read_bw_bytes_s'] / 1e9:.1f} GB/s; bytes read per token at "
      f"batch 1 (the experts chosen, not all): {d['weight_bytes'] / 1e6:.1f} MB")
print(f"  decode tokens/s: batch 1 {d['decode_tok_s_b1']:.1f} ({d['decode_bw_ratio']:.2f} of read "
      f"bandwidth, goal 0.6), batch 64 {d['decode_tok_s_b64']:.1f}")
counts = d["expert_token_counts"]
print(f"  tokens per expert (all sparse layers, whole run): min {min(counts)}, max {max(counts)}")
print("   " + " ".join(str(c) for c in counts))
print(json.dumps({"bench": "engine", "model": "moe",
                  "decode_tok_s_b1": round(d["decode_tok_s_b1"], 2),
                  "decode_tok_s_b64": round(d["decode_tok_s_b64"], 2),
                  "weight_bytes": int(d["weight_bytes"]),
                  "read_bw_bytes_s": int(d["read_bw_bytes_s"]),
                  "decode_bw_ratio": round(d["decode_bw_ratio"], 3),
                  "total_weight_bytes": int(d["total_weight_bytes"]),
                  "expert_token_counts": counts}))
PY
  exit 0
fi

"${FERRY_CLIENT_PYTHON}" "${peer}" prompt "${FERRY_MODEL_GGUF}" --tokens 1024 >"${work}/prompt.json"
echo "engine: Ferry, ${threads} threads..." >&2
"${bench_bin}" "${FERRY_MODEL_GGUF}" "${work}/prompt.json" --threads "${threads}" \
  >"${work}/ferry.json"
echo '{}' >"${work}/peer_batch.json"
echo '{}' >"${work}/peer_batch_fa.json"
echo '{}' >"${work}/peer_bf16.json"
echo '{}' >"${work}/peer_bf16_fa.json"
echo '{}' >"${work}/peer_q4.json"
if [[ "${with_peer}" == 1 ]]; then
  bf16="$(dirname "${FERRY_MODEL_GGUF}")/$(basename "${FERRY_MODEL_GGUF}" .Q4_1.gguf).BF16.gguf"
  if [[ ! -s "${bf16}" ]]; then
    echo "engine: writing ${bf16} (once per machine)..." >&2
    "${FERRY_REF_PYTHON}" "${peer}" bf16-gguf "${FERRY_MODEL_GGUF}" "${bf16}.tmp"
    mv "${bf16}.tmp" "${bf16}"
  fi
  echo "engine: llama.cpp on the BF16 file..." >&2
  "${FERRY_CLIENT_PYTHON}" "${peer}" bench "${bf16}" --threads "${threads}" \
    --prompt-file "${work}/prompt.json" >"${work}/peer_bf16.json"
  echo "engine: llama.cpp on the BF16 file, flash attention on..." >&2
  "${FERRY_CLIENT_PYTHON}" "${peer}" bench "${bf16}" --threads "${threads}" --flash-attn \
    --prompt-file "${work}/prompt.json" >"${work}/peer_bf16_fa.json"
  echo "engine: llama.cpp batched decode on the BF16 file, flash attention off and on..." >&2
  "${FERRY_CLIENT_PYTHON}" "${peer}" bench-batch "${bf16}" --threads "${threads}" --batch 16 \
    --batch 64 --prompt-file "${work}/prompt.json" >"${work}/peer_batch.json"
  "${FERRY_CLIENT_PYTHON}" "${peer}" bench-batch "${bf16}" --threads "${threads}" --batch 16 \
    --batch 64 --flash-attn --prompt-file "${work}/prompt.json" >"${work}/peer_batch_fa.json"
  echo "engine: llama.cpp on the Q4_1 file..." >&2
  "${FERRY_CLIENT_PYTHON}" "${peer}" bench "${FERRY_MODEL_GGUF}" --threads "${threads}" \
    --prompt-file "${work}/prompt.json" >"${work}/peer_q4.json"
fi
"${FERRY_REF_PYTHON}" - "${work}" "${with_peer}" <<'PY'
import json, sys
work, with_peer = sys.argv[1], sys.argv[2] == "1"
ours = json.load(open(f"{work}/ferry.json"))
plain = json.load(open(f"{work}/peer_bf16.json"))
fa = json.load(open(f"{work}/peer_bf16_fa.json"))
q4 = json.load(open(f"{work}/peer_q4.json"))
batch_plain = json.load(open(f"{work}/peer_batch.json")).get("decode_tok_s", {})
batch_fa = json.load(open(f"{work}/peer_batch_fa.json")).get("decode_tok_s", {})
batch_peer = {b: max(batch_plain[b], batch_fa[b]) for b in batch_plain} if with_peer else {}
# The peer's best configuration, figure by figure.
bf16 = {k: max(plain[k], fa[k]) for k in ("decode_tok_s", "prefill_tok_s")} if with_peer else {}
print(f"engine: SmolLM2-135M-Instruct, bf16 weights and KV, {ours['engine']}; "
      f"prompt {ours['prompt_tokens']} tokens, decode {ours['decode_tokens']} tokens at batch 1")
print(f"  machine: read bandwidth {ours['read_bw_bytes_s'] / 1e9:.1f} GB/s (best of 6+, around the decode runs, over "
      f"{ours['read_buffer_bytes'] >> 20} MiB), peak FMA {ours['peak_flops'] / 1e9:.1f} GFLOP/s; "
      f"weights read per decode step {ours['weight_bytes'] / 1e6:.1f} MB")
print(f"  load: {ours['load_seconds']:.2f} s ({ours['load_gib_s']:.2f} GiB/s of model file)")
rows = [("decode tokens/s, batch 1", "decode_tok_s_b1", "decode_tok_s"),
        ("prefill tokens/s, 1024 tokens", "prefill_tok_s", "prefill_tok_s")]
def cell(d, k):
    return "-" if k not in d else f"{d[k]:.1f}"
print(f"  {'':32} {'Ferry':>8} {'llama.cpp bf16':>15} {'(+flash attn)':>14} {'ratio':>6} "
      f"{'llama.cpp Q4_1':>15}")
for name, key, peer_key in rows:
    a = ours[key]
    b = bf16.get(peer_key)
    print(f"  {name:32} {a:8.1f} {cell(plain, peer_key):>15} {cell(fa, peer_key):>14} "
          f"{'-' if b is None else f'{a / b:.2f}':>6} {cell(q4, peer_key):>15}")
for b in ("16", "64"):
    a = ours[f"decode_tok_s_b{b}"]
    peer_b = batch_peer.get(b)
    print(f"  {'decode tokens/s, batch ' + b:32} {a:8.1f} {cell(batch_plain, b):>15} "
          f"{cell(batch_fa, b):>14} {'-' if peer_b is None else f'{a / peer_b:.2f}':>6}")
print("  (ratio: Ferry / the faster llama.cpp bf16 configuration)")
curve = ours["decode_curve_tok_s"]
print("  decode throughput against batch (Ferry's engine, tokens/s): " +
      ", ".join(f"{b}: {curve[b]:.0f}" for b in sorted(curve, key=int)))
print(f"  decode: {ours['decode_bw_ratio']:.2f} of read bandwidth (goal 0.7); prefill: "
      f"{ours['prefill_flops_ratio']:.2f} of peak FLOP/s (goal 0.3); decode at batch 64: "
      f"{ours['decode_b64_flops_ratio']:.2f} of peak FLOP/s (goal 0.3)")
if not with_peer:
    print("  llama.cpp: SKIPPED (--no-peer); the ratios to it are null")
result = {"bench": "engine",
          "decode_tok_s_b1": round(ours["decode_tok_s_b1"], 2),
          "prefill_tok_s": round(ours["prefill_tok_s"], 2),
          "weight_bytes": int(ours["weight_bytes"]),
          "read_bw_bytes_s": int(ours["read_bw_bytes_s"]),
          "decode_bw_ratio": round(ours["decode_bw_ratio"], 3),
          "prefill_flops_ratio": round(ours["prefill_flops_ratio"], 3),
          "decode_vs_llamacpp": round(ours["decode_tok_s_b1"] / bf16["decode_tok_s"], 3)
          if with_peer else None,
          "prefill_vs_llamacpp": round(ours["prefill_tok_s"] / bf16["prefill_tok_s"], 3)
          if with_peer else None,
          "decode_tok_s_b16": round(ours["decode_tok_s_b16"], 2),
          "decode_tok_s_b64": round(ours["decode_tok_s_b64"], 2),
          "decode_b64_flops_ratio": round(ours["decode_b64_flops_ratio"], 3),
          "decode_b64_vs_llamacpp": round(ours["decode_tok_s_b64"] / batch_peer["64"], 3)
          if with_peer else None,
          "llamacpp_decode_tok_s_b64": batch_peer.get("64"),
          "llamacpp_q4_1_decode_tok_s": round(q4["decode_tok_s"], 2) if with_peer else None,
          "llamacpp_q4_1_prefill_tok_s": round(q4["prefill_tok_s"], 2) if with_peer else None,
          "peer_skipped": not with_peer}
print(json.dumps(result))
PY
