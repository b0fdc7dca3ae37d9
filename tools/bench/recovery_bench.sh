#!/usr/bin/env bash
# ferry bench recovery: see recovery_bench.py.
set -euo pipefail
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
: "${FERRY_REF_PYTHON:?run through ./ferry bench recovery}"
# The services' logs (kept when the bench fails).
export TEST_TMPDIR="${TEST_TMPDIR:-$(mktemp -d /tmp/ferry-recovery.XXXXXX)}"
echo "recovery: service logs in ${TEST_TMPDIR}" >&2
exec "${FERRY_REF_PYTHON}" "$(abs "$4")" "$(abs "$1")" "$(abs "$2")" "$(abs "$3")"
