#!/usr/bin/env bash
# Structured output through the openai and anthropic SDKs (router_structured_test.py), on
# aggregated and disaggregated stacks of the default model.
set -euo pipefail
router="$1"; worker="$2"; script="$3"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_MODEL_GGUF
exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${worker}" "${FERRY_MODEL_GGUF}"
