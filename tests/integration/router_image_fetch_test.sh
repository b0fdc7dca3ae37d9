#!/usr/bin/env bash
# Runs router_image_fetch_test (a gtest binary; see its header) on the tiny LLaVA-style model that
# make_tiny_vlm writes with transformers (the reference virtualenv), into TEST_TMPDIR.
#   router_image_fetch_test.sh TEST_BINARY MAKE_TINY_VLM FERRY_WORKER
set -euo pipefail
binary="$1"; make_tiny_vlm="$2"; shift 2
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
export FERRY_TINY_VLM_DIR="${TEST_TMPDIR}/vlm"
"${FERRY_REF_PYTHON}" "${make_tiny_vlm}" "${FERRY_TINY_VLM_DIR}" --size tiny --text llama \
  >"${TEST_TMPDIR}/make.log" 2>&1 || { cat "${TEST_TMPDIR}/make.log" >&2; exit 1; }
exec "${binary}" "$@"
