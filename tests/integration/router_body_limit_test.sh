#!/usr/bin/env bash
# A body over --max_body_bytes: the client reads the 413 and its error body, not a connection reset
# (router_body_limit_test.py), with Python's http.client and with curl.
set -euo pipefail
router="$1"; script="$2"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_MODEL_GGUF
command -v curl >/dev/null || { echo "curl is not installed (apt-get install curl)" >&2; exit 1; }
exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${FERRY_MODEL_GGUF}"
