#!/usr/bin/env bash
# 500 constrained requests on the default model at temperature 1, in process
# (engine_grammar_outputs), every output validated with jsonschema (engine_grammar_validity.py).
# Needs FERRY_MODEL_GGUF and FERRY_GRAMMAR_PYTHON (`./ferry test` sets them).
set -euo pipefail
outputs="$1"
validity="$2"
schemas="$3"
requests=500
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_GRAMMAR_PYTHON FERRY_MODEL_GGUF
"${outputs}" "${schemas}" "${requests}" "${TEST_TMPDIR}/outputs.jsonl"
"${FERRY_GRAMMAR_PYTHON}" "${validity}" "${schemas}" "${TEST_TMPDIR}/outputs.jsonl" "${requests}"
