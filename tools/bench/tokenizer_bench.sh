#!/usr/bin/env bash
# ferry bench tokenizer: Ferry's tokenizer against HF `tokenizers` on the same vocabulary
# (SmolLM2's 49k, from the default model's GGUF; HF gets it as a tokenizer.json written from the
# same metadata) and the same fixed mixed corpus (>= 10 MB: the Python standard library's sources
# and license texts found on every Debian machine, plus varied multilingual strings).
# HF's one-thread figure runs encode_batch with RAYON_NUM_THREADS=1.
set -euo pipefail
bench_bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
reference="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
: "${FERRY_REF_PYTHON:?run through ./ferry bench tokenizer}"
: "${FERRY_MODEL_GGUF:?run through ./ferry bench tokenizer}"
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT
"${FERRY_REF_PYTHON}" "${reference}" bench-corpus 12 1 >"${work}/corpus.json"
"${FERRY_REF_PYTHON}" "${reference}" gguf-to-json "${FERRY_MODEL_GGUF}" >"${work}/tokenizer.json"
ours=$("${bench_bin}" "${FERRY_MODEL_GGUF}" "${work}/corpus.json")
hf1=$(RAYON_NUM_THREADS=1 "${FERRY_REF_PYTHON}" "${reference}" hf-bench "${work}/tokenizer.json" \
      "${work}/corpus.json")
hfall=$("${FERRY_REF_PYTHON}" "${reference}" hf-bench "${work}/tokenizer.json" "${work}/corpus.json")
"${FERRY_REF_PYTHON}" - "${ours}" "${hf1}" "${hfall}" <<'PY'
import json, sys
ours, hf1, hfall = (json.loads(a) for a in sys.argv[1:4])
same = ours["tokens"] == hf1["tokens"]
print(f"tokenizer: SmolLM2 vocabulary (49,152), {ours['bytes'] / 1e6:.1f} MB mixed corpus, "
      f"{ours['threads']} threads; token counts {'equal' if same else 'DIFFER'} "
      f"({ours['tokens']} vs HF {hf1['tokens']})")
rows = [("encode MB/s, 1 thread", ours["encode_mb_s_1t"], hf1["encode_mb_s"]),
        ("encode MB/s, all threads", ours["encode_mb_s_all"], hfall["encode_mb_s"]),
        ("encode MB/s, one 12 MB input", ours["encode_mb_s_one_input_all"], None),
        ("decode tokens/s, 1 thread", ours["decode_tok_s"], hf1["decode_tok_s"])]
print(f"  {'':32} {'Ferry':>14} {'HF tokenizers':>14} {'ratio':>7}")
for name, a, b in rows:
    theirs = "-" if b is None else f"{b:,.1f}"
    ratio = "" if b is None else f"{a / b:.2f}"
    print(f"  {name:32} {a:14,.1f} {theirs:>14} {ratio:>7}")
result = {"bench": "tokenizer", "encode_mb_s_1t": round(ours["encode_mb_s_1t"], 2),
          "encode_mb_s_all": round(ours["encode_mb_s_all"], 2),
          "decode_tok_s": round(ours["decode_tok_s"]),
          "vs_hf_1t": round(ours["encode_mb_s_1t"] / hf1["encode_mb_s"], 2),
          "vs_hf_all": round(ours["encode_mb_s_all"] / hfall["encode_mb_s"], 2),
          "hf_encode_mb_s_1t": round(hf1["encode_mb_s"], 2), "tokens_equal": same}
print(json.dumps(result))
sys.exit(0 if same else 1)
PY
