#!/usr/bin/env bash
# Anthropic Messages and OpenAI Responses through their SDKs (router_adapters_test.py), on tiny
# test models made with tools/make_tiny_model and scripted null workers.
set -euo pipefail
router="$1"; worker="$2"; kvstore="$3"; make_tiny_model="$4"; script="$5"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_REF_PYTHON
"${FERRY_REF_PYTHON}" "${make_tiny_model}" models "${TEST_TMPDIR}/models" >"${TEST_TMPDIR}/make.log" 2>&1 ||
  { cat "${TEST_TMPDIR}/make.log" >&2; exit 1; }
exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${worker}" "${kvstore}" "${TEST_TMPDIR}/models" \
  "${TEST_SRCDIR}/ferry/tools/make_tiny_model/chat_templates"
