#!/usr/bin/env bash
# Runs encoder_test (a gtest binary; see its header) on the tiny LLaVA-style model that
# make_tiny_vlm writes with transformers (the reference virtualenv): --size tiny, the Llama text
# model, into TEST_TMPDIR.
#   encoder_test.sh TEST_BINARY MAKE_TINY_VLM FERRY_ENCODER
set -euo pipefail
binary="$1"
make_tiny_vlm="$2"
shift 2
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
export FERRY_TINY_VLM_DIR="${TEST_TMPDIR}/vlm"
"${FERRY_REF_PYTHON}" "${make_tiny_vlm}" "${FERRY_TINY_VLM_DIR}/llama" --size tiny --text llama \
  >"${TEST_TMPDIR}/make_llama.log" 2>&1 ||
  { cat "${TEST_TMPDIR}/make_llama.log" >&2; exit 1; }
exec "${binary}" "$@"
