#!/usr/bin/env bash
# Models loaded by Ferry against HF transformers' own loading: the same config and bit-identical
# tensors in fp32 and bf16, for the default model's GGUF (dequantized, Q/K un-permuted) and for
# tiny HF-format models that tools/make_tiny_model makes here (GQA Llama in fp32 and bf16,
# Llama with llama3 RoPE scaling and tied embeddings, Qwen2 with q/k/v biases, GQA Mistral, Llama
# with linear RoPE scaling). Not qwen3_*: transformers 4.47 has no Qwen3 to load it with; the
# forward-pass tests cover it against tools/python/forward_reference.py.
set -euo pipefail
check="$1"
reference="$2"
make_tiny_model="$3"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_MODEL_GGUF
t="${TEST_TMPDIR}"
"${FERRY_REF_PYTHON}" "${make_tiny_model}" models "${t}/models" >"${t}/make.log" 2>&1 ||
  { cat "${t}/make.log" >&2; exit 1; }
for model in "${FERRY_MODEL_GGUF}" "${t}"/models/llama* "${t}"/models/mistral* \
  "${t}"/models/qwen*; do
  case "$(basename "${model}")" in qwen3_*) continue ;; esac
  "${FERRY_REF_PYTHON}" "${reference}" "${model}" >"${t}/reference.json" 2>"${t}/reference.log" ||
    { cat "${t}/reference.log" >&2; exit 1; }
  echo "$(basename "${model}"):"
  "${check}" "${model}" "${t}/reference.json"
done
