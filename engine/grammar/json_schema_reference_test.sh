#!/usr/bin/env bash
# JSON Schema and regex -> GBNF against llguidance, jsonschema and Python's re at the byte level
# (json_schema_reference.py), then the token-level differential against llguidance's own JSON
# Schema compiler on SmolLM2's vocabulary over json-schema-test-suite and hand-written 2020-12
# schemas (json_schema_differential.py). Needs FERRY_GRAMMAR_PYTHON, FERRY_REF_PYTHON (writes
# tokenizer.json from the GGUF), FERRY_MODEL_GGUF (`./ferry setup` makes them) and Debian's
# json-schema-test-suite package.
set -euo pipefail
to_gbnf="$1"
reference="$2"
mask_tool="$3"
differential="$4"
grammar_reference="$5"
tokenizer_reference="$6"
suite=/usr/share/json-schema-test-suite/tests
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_GRAMMAR_PYTHON FERRY_REF_PYTHON FERRY_MODEL_GGUF
"${FERRY_GRAMMAR_PYTHON}" "${reference}" "${to_gbnf}"
"${FERRY_REF_PYTHON}" "${tokenizer_reference}" gguf-to-json "${FERRY_MODEL_GGUF}" >"${TEST_TMPDIR}/tokenizer.json"
PYTHONPATH="$(dirname "${grammar_reference}"):$(dirname "${reference}")" \
  "${FERRY_GRAMMAR_PYTHON}" "${differential}" "${to_gbnf}" "${mask_tool}" "${FERRY_MODEL_GGUF}" \
  "${TEST_TMPDIR}/tokenizer.json" "${suite}"
