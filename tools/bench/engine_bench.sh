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
# --weights native measures the block-format path instead (weights computed as the file stores
# them, engine/backends/cpu/cpu_quant.h) on the default Q4_1 file and on a Q8_0 file made once per
# machine by llama.cpp's quantizer from the BF16 copy: decode at batch 1 and 16 and prefill of 1024
# tokens against llama.cpp on the same files, threads and prompt ids; the whole decode step's
# share of read bandwidth; and a standalone one-row product over ~512 MiB of packed Q4_1 and bf16
# weights, each round against a read of the bandwidth buffer just before it (the VM's bandwidth
# drifts, so the median and the worst round are reported).
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
weights=bf16
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --no-peer) with_peer=0; shift ;;
    --model) model="$2"; shift 2 ;;
    --weights) weights="$2"; shift 2 ;;
    *) echo "usage: ferry bench engine [--threads N] [--no-peer] [--model smollm2|moe]" \
         "[--weights bf16|native]" >&2; exit 2 ;;
  esac
done
[[ "${weights}" == bf16 || "${weights}" == native ]] || { echo "--weights: bf16 or native" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT
models_dir="$(dirname "${FERRY_MODEL_GGUF}")"
bf16="${models_dir}/$(basename "${FERRY_MODEL_GGUF}" .Q4_1.gguf).BF16.gguf"
make_bf16() {
  if [[ ! -s "${bf16}" ]]; then
    echo "engine: writing ${bf16} (once per machine)..." >&2
    "${FERRY_REF_PYTHON}" "${peer}" bf16-gguf "${FERRY_MODEL_GGUF}" "${bf16}.tmp"
    mv "${bf16}.tmp" "${bf16}"
  fi
}

if [[ "${weights}" == native ]]; then
  q8="${models_dir}/$(basename "${FERRY_MODEL_GGUF}" .Q4_1.gguf).Q8_0.gguf"
  if [[ ! -s "${q8}" ]]; then
    make_bf16
    echo "engine: writing ${q8} with llama.cpp's quantizer (once per machine)..." >&2
    "${FERRY_CLIENT_PYTHON}" "$(dirname "${peer}")/llamacpp_reference.py" quantize "${bf16}" \
      "${q8}.tmp" --type q8_0
    mv "${q8}.tmp" "${q8}"
  fi
  "${FERRY_CLIENT_PYTHON}" "${peer}" prompt "${FERRY_MODEL_GGUF}" --tokens 1024 >"${work}/prompt.json"
  echo "engine: the standalone one-row product against read bandwidth, ${threads} threads..." >&2
  "${bench_bin}" - - --model gemv --threads "${threads}" >"${work}/gemv.json"
  for name in q4_1 q8_0; do
    file="${FERRY_MODEL_GGUF}"
    [[ "${name}" == q8_0 ]] && file="${q8}"
    echo "engine: Ferry on ${file}, --weights native, ${threads} threads..." >&2
    "${bench_bin}" "${file}" "${work}/prompt.json" --threads "${threads}" --weights native \
      >"${work}/ferry_${name}.json"
    echo '{}' >"${work}/peer_${name}.json"
    echo '{}' >"${work}/peer_batch_${name}.json"
    if [[ "${with_peer}" == 1 ]]; then
      echo "engine: llama.cpp on ${file}..." >&2
      "${FERRY_CLIENT_PYTHON}" "${peer}" bench "${file}" --threads "${threads}" \
        --prompt-file "${work}/prompt.json" >"${work}/peer_${name}.json"
      "${FERRY_CLIENT_PYTHON}" "${peer}" bench-batch "${file}" --threads "${threads}" --batch 16 \
        --prompt-file "${work}/prompt.json" >"${work}/peer_batch_${name}.json"
    fi
  done
  "${FERRY_REF_PYTHON}" - "${work}" "${with_peer}" <<'PY'
import json, sys
work, with_peer = sys.argv[1], sys.argv[2] == "1"
load = lambda name: json.load(open(f"{work}/{name}.json"))
gemv = load("gemv")
result = {"bench": "engine", "weights": "native", "peer_skipped": not with_peer}
print(f"engine --weights native: SmolLM2-135M-Instruct, weights computed as the files store them, "
      f"bf16 KV, {gemv['engine']}")
print(f"  {'':34} {'Ferry':>8} {'llama.cpp':>10} {'ratio':>6}  goal")
for name in ("q4_1", "q8_0"):
    ours, peer = load(f"ferry_{name}"), load(f"peer_{name}")
    batch = load(f"peer_batch_{name}").get("decode_tok_s", {})
    print(f"  {name.upper()} ({ours['weights']}; {ours['weight_bytes'] / 1e6:.1f} MB read per decode "
          f"step, {ours['decode_bw_ratio']:.2f} of read bandwidth at batch 1)")
    rows = [("decode tokens/s, batch 1", ours["decode_tok_s_b1"], peer.get("decode_tok_s"), 1.5,
             "decode_vs_llamacpp"),
            ("decode tokens/s, batch 16", ours["decode_tok_s_b16"], batch.get("16"), 1.5,
             "decode_b16_vs_llamacpp"),
            ("prefill tokens/s, 1024 tokens", ours["prefill_tok_s"], peer.get("prefill_tok_s"), 1.0,
             "prefill_vs_llamacpp")]
    for label, a, b, goal, key in rows:
        ratio = a / b if b else None
        print(f"    {label:32} {a:8.1f} {'-' if b is None else f'{b:.1f}':>10} "
              f"{'-' if ratio is None else f'{ratio:.2f}':>6}  >= {goal}")
        result[f"{name}_{key}"] = round(ratio, 3) if ratio else None
        result[f"{name}_{key.split('_vs_')[0]}_tok_s"] = round(a, 2)
    result[f"{name}_decode_bw_ratio"] = round(ours["decode_bw_ratio"], 3)
print(f"  one-row product over {gemv['q4_1_bytes'] / 2**20:.0f} MiB against read bandwidth "
      f"({len(gemv['gemv_rounds'])} rounds, median / worst; goal >= 0.8): Q4_1 "
      f"{gemv['gemv_bw_ratio']:.2f} / {gemv['gemv_bw_ratio_worst']:.2f}, bf16 "
      f"{gemv['bf16_gemv_bw_ratio']:.2f} / {gemv['bf16_gemv_bw_ratio_worst']:.2f}, Q4_K "
      f"{gemv['q4_k_gemv_bw_ratio']:.2f} / {gemv['q4_k_gemv_bw_ratio_worst']:.2f}, Q6_K "
      f"{gemv['q6_k_gemv_bw_ratio']:.2f} / {gemv['q6_k_gemv_bw_ratio_worst']:.2f}")
print("    read bandwidth per round (GB/s): " +
      ", ".join(f"{b / 1e9:.1f}" for b in gemv["read_bw_bytes_s"]))
if not with_peer:
    print("  llama.cpp: SKIPPED (--no-peer); the ratios to it are null")
result["gemv_bw_ratio"] = round(gemv["gemv_bw_ratio"], 3)
result["gemv_bw_ratio_worst"] = round(gemv["gemv_bw_ratio_worst"], 3)
result["bf16_gemv_bw_ratio"] = round(gemv["bf16_gemv_bw_ratio"], 3)
result["bf16_gemv_bw_ratio_worst"] = round(gemv["bf16_gemv_bw_ratio_worst"], 3)
for k in ("q4_k", "q6_k"):
    result[f"{k}_gemv_bw_ratio"] = round(gemv[f"{k}_gemv_bw_ratio"], 3)
print(json.dumps(result))
PY
  exit 0
fi

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
  make_bf16
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
