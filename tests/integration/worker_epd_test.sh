#!/usr/bin/env bash
# Runs worker_epd_test (a gtest binary; see its header) on the tiny LLaVA-style model that
# make_tiny_vlm writes with transformers (the reference virtualenv): --size tiny with the Llama
# text model, seed 0 (llama/) and seed 1 (llama_seed1/: another vision tower, another digest),
# into TEST_TMPDIR.
#   worker_epd_test.sh TEST_BINARY MAKE_TINY_VLM FERRY_ENCODER FERRY_WORKER MAKE_TINY_MODEL
set -euo pipefail
binary="$1"
make_tiny_vlm="$2"
export FERRY_ENCODER="$3"
shift 3
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
export FERRY_TINY_VLM_DIR="${TEST_TMPDIR}/vlm"
for seed in 0 1; do
  name=llama
  [[ "${seed}" == 0 ]] || name="llama_seed${seed}"
  "${FERRY_REF_PYTHON}" "${make_tiny_vlm}" "${FERRY_TINY_VLM_DIR}/${name}" --size tiny \
    --text llama --seed "${seed}" >"${TEST_TMPDIR}/make_${name}.log" 2>&1 ||
    { cat "${TEST_TMPDIR}/make_${name}.log" >&2; exit 1; }
done
exec "${binary}" "$@"
