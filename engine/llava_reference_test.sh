#!/usr/bin/env bash
# A LLaVA-style model end to end in-process against HF transformers 4.47.1: make_tiny_vlm writes
# the tiny random-weight model (--size tiny; --text sliding_window, a Mistral text model with a
# window of 8; --text hybrid, a Qwen2 with a window of 8 on one of its 2 layers);
# llava_reference.py makes 20 prompts' images with PIL (PNG RGB, grey, RGBA, palette; JPEG colour
# and grey; 9x9 to 300x120) and texts, with 1 image and with 2 images. llava_check
# (engine/llava_check.cc) renders each with the model's chat template, tokenizes it with the
# engine's tokenizer and expands the image tokens; the reference requires
# LlavaProcessor's input_ids from the rendered text to be the same. Then:
#   logits:   every row of every prompt, Ferry (image files -> DecodeImage -> ApplyOrientation ->
#             Preprocess -> VisionTower::Encode -> the rows as input embeddings, fp32 weights,
#             fp32 KV) against LlavaForConditionalGeneration (fp32, eager):
#             max|ferry - ref| / max|ref| <= 1e-4 per row, forward_reference_test's bound for the
#             exact path; the longest prompt also bit-identical in chunks of 1, 7 and 64 tokens;
#   greedy:   20 tokens per prompt through the Engine (all prompts at once, images as
#             EngineRequest::images, prefill chunks of 7 tokens so images span chunks, end of
#             sequence ignored), token for token up to the first reference top-2 margin < 1e-4.
# The sliding-window model (every layer a window of 8 over prompts of 42-79 tokens) and the hybrid
# one (--text hybrid: Qwen2, full attention on layer 0, a window of 8 on layer 1; the reference
# gives each layer its own mask, see llava_reference.py) run the same.
set -euo pipefail
check="$1"
reference="$2"
make_tiny_vlm="$3"
source "${TEST_SRCDIR}/ferry/tools/testing/require_env.sh" FERRY_REF_PYTHON
t="${TEST_TMPDIR}"

ref() {  # python reference, its log shown on failure
  "${FERRY_REF_PYTHON}" "${reference}" "$@" 2>"${t}/ref.log" || { cat "${t}/ref.log" >&2; exit 1; }
}

"${FERRY_REF_PYTHON}" "${reference}" cases "${t}/cases"
for variant in llama sliding_window hybrid; do
  model="${t}/model_${variant}"
  "${FERRY_REF_PYTHON}" "${make_tiny_vlm}" "${model}" --size tiny --text "${variant}" \
    >"${t}/make.log" 2>&1 || { cat "${t}/make.log" >&2; exit 1; }
  cases="${t}/cases/cases.json"
  "${check}" prepare "${model}" "${cases}" >"${t}/${variant}.json"
  mkdir -p "${t}/ref_${variant}"
  ref logits "${model}" "${t}/${variant}.json" "${t}/ref_${variant}"
  echo "== ${variant}: logits, fp32 weights, fp32 KV"
  "${check}" logits "${model}" "${t}/${variant}.json" "${t}/ref_${variant}" --tolerance 1e-4 \
    --chunks 1,7,64
  ref generate "${model}" "${t}/${variant}.json" --max-new-tokens 20 >"${t}/gen_${variant}.json"
  echo "== ${variant}: greedy, 20 tokens, through the engine"
  "${check}" generate "${model}" "${t}/${variant}.json" "${t}/gen_${variant}.json" \
    --max-new-tokens 20 --margin 1e-4 --prefill-chunk 7
done
