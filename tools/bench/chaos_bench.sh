#!/usr/bin/env bash
# ferry bench chaos: see chaos_bench.py. Arguments: chaos_bench.py, ferry_services.py,
# deploy/local/stack, the stack's four binaries, then the bench's own flags.
set -euo pipefail
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
: "${FERRY_REF_PYTHON:?run through ./ferry bench chaos}"
# The services' logs (kept; the KV store's directory is removed at the end).
export TEST_TMPDIR="${TEST_TMPDIR:-$(mktemp -d /tmp/ferry-chaos.XXXXXX)}"
echo "chaos: service logs in ${TEST_TMPDIR}" >&2
paths=()
for _ in 1 2 3 4 5 6 7; do
  paths+=("$(abs "$1")")
  shift
done
exec "${FERRY_REF_PYTHON}" "${paths[@]}" "$@"
