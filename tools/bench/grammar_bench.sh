#!/usr/bin/env bash
# ferry bench grammar: see grammar_bench.py (mask time per token vs llguidance on the same
# schemas, vocabulary and documents; constrained vs free decode at batch 16 on SmolLM2).
#
#   ferry bench grammar [--repeat N] [--rounds N]
set -euo pipefail
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
: "${FERRY_GRAMMAR_PYTHON:?run through ./ferry bench grammar}"
: "${FERRY_REF_PYTHON:?run through ./ferry bench grammar}"
: "${FERRY_MODEL_GGUF:?run through ./ferry bench grammar}"
mask_tool=$(abs "$1") to_gbnf=$(abs "$2") decode=$(abs "$3") reference=$(abs "$4")
tokenizer_reference=$(abs "$5") schemas=$(abs "$6") bench=$(abs "$7")
shift 7
exec "${FERRY_GRAMMAR_PYTHON}" "${bench}" "${mask_tool}" "${to_gbnf}" "${decode}" "${reference}" \
  "${tokenizer_reference}" "${schemas}" "$@"
