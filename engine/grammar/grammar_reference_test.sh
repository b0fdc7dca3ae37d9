#!/usr/bin/env bash
# Differential against llguidance 1.9.1 on SmolLM2's vocabulary (49152 tokens): for GBNF grammars
# (JSON, arithmetic, nested lists, Unicode character classes, {m,n} repetitions), after every
# prefix of valid and invalid token sequences, Ferry's allowed-token set equals llguidance's, and
# both accept the same number of tokens of each sequence. Where the grammar forces bytes,
# llguidance allows only its canonical tokenization of them; there its set must be a subset of
# Ferry's and Ferry's extra tokens must agree with the forced bytes (grammar_reference.py).
# Needs FERRY_GRAMMAR_PYTHON, FERRY_REF_PYTHON (writes tokenizer.json from the GGUF) and
# FERRY_MODEL_GGUF (`./ferry test` sets them).
set -euo pipefail
tool="$1"
reference="$2"
tokenizer_reference="$3"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_GRAMMAR_PYTHON FERRY_REF_PYTHON FERRY_MODEL_GGUF
t="${TEST_TMPDIR}"
"${FERRY_REF_PYTHON}" "${tokenizer_reference}" gguf-to-json "${FERRY_MODEL_GGUF}" >"${t}/tokenizer.json"
"${FERRY_GRAMMAR_PYTHON}" "${reference}" cases "${t}/tokenizer.json" "${t}/cases.json"
"${tool}" masks "${FERRY_MODEL_GGUF}" "${t}/cases.json" >"${t}/ferry.jsonl"
"${FERRY_GRAMMAR_PYTHON}" "${reference}" compare "${t}/tokenizer.json" "${t}/cases.json" "${t}/ferry.jsonl"
