#!/usr/bin/env bash
# Secrets rotated on a running router, worker and store (secret_rotation_test.py).
set -euo pipefail
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_MODEL_GGUF
exec "${FERRY_CLIENT_PYTHON}" "$5" "$1" "$2" "$3" "$4" "${FERRY_MODEL_GGUF}"
