#!/usr/bin/env bash
# ferry bench serve: see serve_bench.py. Arguments: serve_bench.py, ferry_services.py,
# deploy/local/stack, tokenizer_reference.py, llamacpp_peer.py, the stack's five binaries,
# stack_bench, ferry-load, then the bench's own flags.
set -euo pipefail
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
: "${FERRY_REF_PYTHON:?run through ./ferry bench serve}"
: "${FERRY_CLIENT_PYTHON:?run through ./ferry bench serve}"
# The servers' and aiperf's logs (kept).
export TEST_TMPDIR="${TEST_TMPDIR:-$(mktemp -d /tmp/ferry-serve.XXXXXX)}"
echo "serve: logs in ${TEST_TMPDIR}" >&2
paths=()
for _ in 1 2 3 4 5 6 7 8 9 10; do
  paths+=("$(abs "$1")")
  shift
done
stack_bench=$(abs "$1")
ferry_load=$(abs "$2")
shift 2
exec "${FERRY_REF_PYTHON}" "${paths[@]}" --stack_bench "${stack_bench}" --ferry_load "${ferry_load}" "$@"
