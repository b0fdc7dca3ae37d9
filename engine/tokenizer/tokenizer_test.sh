#!/usr/bin/env bash
# Runs tokenizer_test on the default model's GGUF and on the five small tokenizers HF `tokenizers`
# trains here (tools/make_tiny_model). Needs FERRY_REF_PYTHON and FERRY_MODEL_GGUF.
set -euo pipefail
test_binary="$1"
make_tiny_model="$2"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_MODEL_GGUF
"${FERRY_REF_PYTHON}" "${make_tiny_model}" tokenizers "${TEST_TMPDIR}/tiny"
json=$(ls "${TEST_TMPDIR}"/tiny/*/tokenizer.json | paste -sd, -)
exec "${test_binary}" --gguf="${FERRY_MODEL_GGUF}" --json="${json}"
