#!/usr/bin/env bash
# Tokenizer conformance on 10,000 varied strings (ASCII, CJK, emoji, combining marks, RTL,
# whitespace and digit runs, code, special-token strings, random code points):
#  0. HF `tokenizers` on five small tokenizers it trains here (tools/make_tiny_model): GPT-2,
#     Llama-3 and Qwen2 (NFC) byte-level styles, Llama-2 (legacy normalizer) and Mistral
#     (Metaspace) SentencePiece styles with byte fallback: identical ids and decoded text.
#  1. HF `tokenizers` on a tokenizer.json written from the default model's GGUF vocabulary:
#     Ferry's tokenizer loaded from that tokenizer.json, and loaded from the GGUF itself, must give
#     identical ids and decoded text.
#  2. llama.cpp (llama-cpp-python, vocab_only) on the GGUF: identical ids and text, except on the
#     strings where llama.cpp and HF disagree with each other; those must be rare (< 0.5%) and each
#     must contain unassigned or private-use code points (llama.cpp's Unicode tables classify
#     those differently from Oniguruma's). Ferry follows HF there.
# Needs FERRY_REF_PYTHON, FERRY_CLIENT_PYTHON and FERRY_MODEL_GGUF (`./ferry test` sets them).
set -euo pipefail
conformance="$1"
reference="$2"
make_tiny_model="$3"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_CLIENT_PYTHON FERRY_MODEL_GGUF
t="${TEST_TMPDIR}"
"${FERRY_REF_PYTHON}" "${reference}" corpus 10000 1 >"${t}/corpus.json"
"${FERRY_REF_PYTHON}" "${make_tiny_model}" tokenizers "${t}/tiny"
for dir in "${t}"/tiny/*/; do
  name=$(basename "${dir}")
  "${FERRY_REF_PYTHON}" "${reference}" hf "${dir}/tokenizer.json" "${t}/corpus.json" >"${dir}/hf.json"
  echo "HF tokenizers, tiny ${name}:"
  "${conformance}" --json "${dir}/tokenizer.json" "${t}/corpus.json" "${dir}/hf.json"
done
"${FERRY_REF_PYTHON}" "${reference}" gguf-to-json "${FERRY_MODEL_GGUF}" >"${t}/tokenizer.json"
"${FERRY_REF_PYTHON}" "${reference}" hf "${t}/tokenizer.json" "${t}/corpus.json" >"${t}/hf.json"
echo "HF tokenizers, Ferry from tokenizer.json:"
"${conformance}" --json "${t}/tokenizer.json" "${t}/corpus.json" "${t}/hf.json"
echo "HF tokenizers, Ferry from GGUF:"
"${conformance}" --gguf "${FERRY_MODEL_GGUF}" "${t}/corpus.json" "${t}/hf.json"

"${FERRY_CLIENT_PYTHON}" "${reference}" llama "${FERRY_MODEL_GGUF}" "${t}/corpus.json" \
  >"${t}/llama.json" 2>"${t}/llama.log"
"${FERRY_REF_PYTHON}" - "${t}" <<'PY'
import json, sys, unicodedata
t = sys.argv[1]
corpus = json.load(open(f"{t}/corpus.json"))
hf = json.load(open(f"{t}/hf.json"))
llama = json.load(open(f"{t}/llama.json"))
disagree = [i for i in range(len(corpus)) if hf[i]["ids"] != llama[i]["ids"]]
for i in disagree:
    if not any(unicodedata.category(ch) in ("Cn", "Co") for ch in corpus[i]):
        sys.exit(f"llama.cpp and HF disagree on string {i} without unassigned code points: "
                 f"{corpus[i]!r}")
if len(disagree) > len(corpus) // 200:
    sys.exit(f"llama.cpp and HF disagree on {len(disagree)} strings: too many")
keep = [i for i in range(len(corpus)) if i not in set(disagree)]
json.dump([corpus[i] for i in keep], open(f"{t}/corpus_llama.json", "w"))
json.dump([llama[i] for i in keep], open(f"{t}/llama_kept.json", "w"))
print(f"llama.cpp and HF disagree on {len(disagree)} of {len(corpus)} strings "
      f"(all with unassigned/private-use code points); comparing the other {len(keep)}")
PY
echo "llama.cpp, Ferry from GGUF:"
"${conformance}" --gguf "${FERRY_MODEL_GGUF}" "${t}/corpus_llama.json" "${t}/llama_kept.json"
