#!/usr/bin/env bash
# The router half of E/P/D (router_epd_test.py, with the openai SDK) on the tiny VLM that
# make_tiny_vlm writes with transformers, checked against router_vlm_reference.py (transformers'
# LlavaProcessor and LlavaForConditionalGeneration).
#   router_epd_test.sh FERRY_ROUTER FERRY_WORKER FERRY_ENCODER MAKE_TINY_VLM REFERENCE_SCRIPT
#                      TEST_SCRIPT FERRY_KVSTORE
set -euo pipefail
router="$1"; worker="$2"; encoder="$3"; make_tiny_vlm="$4"; reference="$5"; script="$6"
kvstore="$7"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_REF_PYTHON
model="${TEST_TMPDIR}/vlm"
"${FERRY_REF_PYTHON}" "${make_tiny_vlm}" "${model}" --size tiny --text llama \
  >"${TEST_TMPDIR}/make.log" 2>&1 || { cat "${TEST_TMPDIR}/make.log" >&2; exit 1; }
"${FERRY_REF_PYTHON}" "${reference}" "${TEST_SRCDIR}/ferry/tools/python" "${model}" \
  "${TEST_TMPDIR}/reference" --max-new-tokens 24 --extra-images 4 \
  >"${TEST_TMPDIR}/reference.log" 2>&1 ||
  { cat "${TEST_TMPDIR}/reference.log" >&2; exit 1; }
exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${worker}" "${encoder}" "${model}" \
  "${TEST_TMPDIR}/reference/reference.json" "${kvstore}"
