#!/usr/bin/env bash
# Runs worker_vlm_test (a gtest binary; see its header) on the tiny LLaVA-style models that
# make_tiny_vlm writes with transformers (the reference virtualenv): --size tiny, the Llama text
# model, the sliding-window one and the hybrid one (Qwen2, a window on one of 2 layers), into
# TEST_TMPDIR.
#   worker_vlm_test.sh TEST_BINARY MAKE_TINY_VLM FERRY_WORKER MAKE_TINY_MODEL
set -euo pipefail
binary="$1"
make_tiny_vlm="$2"
shift 2
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
export FERRY_TINY_VLM_DIR="${TEST_TMPDIR}/vlm"
for variant in llama sliding_window hybrid; do
  "${FERRY_REF_PYTHON}" "${make_tiny_vlm}" "${FERRY_TINY_VLM_DIR}/${variant}" --size tiny \
    --text "${variant}" >"${TEST_TMPDIR}/make_${variant}.log" 2>&1 ||
    { cat "${TEST_TMPDIR}/make_${variant}.log" >&2; exit 1; }
done
exec "${binary}" "$@"
