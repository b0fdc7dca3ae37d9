#!/usr/bin/env bash
# ferry bench epd: see epd_bench.py. The model (make_tiny_vlm, ~700 MB of f32 safetensors) and the
# services' logs go to a temporary directory: removed after a run that succeeded; after a failure
# the model is removed and the logs kept.
#
#   ferry bench epd [--rounds N] [--warmup N] [--clients N] [--mix_requests N] [--mix_passes N]
set -euo pipefail
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
: "${FERRY_REF_PYTHON:?run through ./ferry bench epd}"
command -v taskset >/dev/null || { echo "epd: needs taskset (util-linux)" >&2; exit 1; }
work=$(mktemp -d /tmp/ferry-epd.XXXXXX)
export FERRY_EPD_WORK="${work}"
export TEST_TMPDIR="${work}/logs"
mkdir -p "${TEST_TMPDIR}"
cleanup() {
  local rc=$?
  rm -rf "${work}/vlm"
  if [[ ${rc} -eq 0 ]]; then
    rm -rf "${work}"
  else
    echo "epd: failed; service logs kept in ${TEST_TMPDIR}" >&2
  fi
}
trap cleanup EXIT
router=$(abs "$1") worker=$(abs "$2") encoder=$(abs "$3") services=$(abs "$4")
make_vlm=$(abs "$5") bench=$(abs "$6")
shift 6
"${FERRY_REF_PYTHON}" "${bench}" "${router}" "${worker}" "${encoder}" "${services}" "${make_vlm}" "$@"
