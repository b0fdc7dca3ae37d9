#!/usr/bin/env bash
# Tool-call grammars against llguidance (see tool_call_grammar_reference.py). Needs
# FERRY_GRAMMAR_PYTHON (`./ferry setup` makes it).
set -euo pipefail
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_GRAMMAR_PYTHON
cases="${TEST_TMPDIR}/tool_call_cases.jsonl"
rm -f "${cases}"
FERRY_TOOL_CALL_CASES="${cases}" "$1" >/dev/null
exec "${FERRY_GRAMMAR_PYTHON}" "$2" "${cases}"
