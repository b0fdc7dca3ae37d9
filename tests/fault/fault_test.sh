#!/usr/bin/env bash
# Runs one fault-injection test (a Python script of this directory) with the client virtualenv's
# Python, on a tiny test model made with tools/make_tiny_model (its tokenizer, chat template and
# config: the workers run the null engine, which needs no weights).
#   fault_test.sh FERRY_ROUTER FERRY_WORKER MAKE_TINY_MODEL SCRIPT [ARGS...]
set -euo pipefail
router="$1"; worker="$2"; make_tiny_model="$3"; script="$4"; shift 4
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_CLIENT_PYTHON FERRY_REF_PYTHON
models="${TEST_TMPDIR}/models"
"${FERRY_REF_PYTHON}" "${make_tiny_model}" models "${models}" >"${TEST_TMPDIR}/make.log" 2>&1 ||
  { cat "${TEST_TMPDIR}/make.log" >&2; exit 1; }
exec "${FERRY_CLIENT_PYTHON}" "${script}" "${router}" "${worker}" "${models}/llama_gqa_bf16" "$@"
