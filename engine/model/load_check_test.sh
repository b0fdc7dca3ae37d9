#!/usr/bin/env bash
# The default model loaded by Ferry (GGUF -> HF-layout fp32 and bf16 tensors) against HF
# transformers' own GGUF loading: the same config and bit-identical tensors.
set -euo pipefail
check="$1"
reference="$2"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_MODEL_GGUF
"${FERRY_REF_PYTHON}" "${reference}" "${FERRY_MODEL_GGUF}" >"${TEST_TMPDIR}/reference.json" \
  2>"${TEST_TMPDIR}/reference.log" || { cat "${TEST_TMPDIR}/reference.log" >&2; exit 1; }
"${check}" "${FERRY_MODEL_GGUF}" "${TEST_TMPDIR}/reference.json"
