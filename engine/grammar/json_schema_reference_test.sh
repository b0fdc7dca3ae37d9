#!/usr/bin/env bash
# JSON Schema and regex -> GBNF against llguidance, jsonschema and Python's re (see
# json_schema_reference.py). Needs FERRY_GRAMMAR_PYTHON (`./ferry setup` makes it).
set -euo pipefail
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_GRAMMAR_PYTHON
exec "${FERRY_GRAMMAR_PYTHON}" "$2" "$1"
