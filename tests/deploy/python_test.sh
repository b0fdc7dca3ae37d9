#!/usr/bin/env bash
# Runs a Python test of this directory (image_smoke_test.py, rendered_pods_test.py) with the client
# virtualenv's Python (it has PyYAML).
#   image_smoke_test.sh SCRIPT ARGS...
set -euo pipefail
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON
script="$1"
shift
exec "${FERRY_CLIENT_PYTHON}" "${script}" "$@"
