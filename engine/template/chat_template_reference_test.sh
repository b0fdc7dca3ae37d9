#!/usr/bin/env bash
# Chat templates rendered by Ferry vs HF transformers (its own _compile_jinja_template) on
# SmolLM2's template (from the default model's GGUF) and five real-world-shaped templates (ChatML
# with tools, Llama-3.1, Mistral v0.3 with tool calls, DeepSeek, Qwen3 with reasoning and tools),
# 150 conversations each: identical strings, the same cases failing, and user spans that hold
# only text the user supplied. Needs FERRY_REF_PYTHON and FERRY_MODEL_GGUF.
set -euo pipefail
render="$1"
reference="$2"
shift 2
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON FERRY_MODEL_GGUF
t="${TEST_TMPDIR}"
"${FERRY_REF_PYTHON}" "${reference}" gguf-template "${FERRY_MODEL_GGUF}" >"${t}/smollm2.jinja"
for template in "${t}/smollm2.jinja" "$@"; do
  name=$(basename "${template}" .jinja)
  "${FERRY_REF_PYTHON}" "${reference}" cases "${template}" 150 7 >"${t}/${name}.cases.json"
  "${FERRY_REF_PYTHON}" "${reference}" render "${t}/${name}.cases.json" >"${t}/${name}.hf.json"
  "${render}" "${t}/${name}.cases.json" >"${t}/${name}.ferry.json"
  echo -n "${name}: "
  "${FERRY_REF_PYTHON}" "${reference}" compare "${t}/${name}.cases.json" "${t}/${name}.hf.json" \
    "${t}/${name}.ferry.json"
done
