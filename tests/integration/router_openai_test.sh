#!/usr/bin/env bash
# The router through the openai SDK (router_openai_test.py): on a tiny test model made with
# tools/make_tiny_model (with --pd: a disaggregated stack next to an aggregated one), or with
# --smollm2 on the default model.
set -euo pipefail
router="$1"; worker="$2"; make_tiny_model="$3"; script="$4"; mode="${5:-tiny}"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_REF_PYTHON
if [[ "${mode}" == "--smollm2" ]]; then
  source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_MODEL_GGUF
  exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${worker}" "${FERRY_MODEL_GGUF}" --smollm2
fi
"${FERRY_REF_PYTHON}" "${make_tiny_model}" models "${TEST_TMPDIR}/models" >"${TEST_TMPDIR}/make.log" 2>&1 ||
  { cat "${TEST_TMPDIR}/make.log" >&2; exit 1; }
exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${worker}" "${TEST_TMPDIR}/models/llama_gqa_bf16" \
  ${mode/tiny/}
