// What the router must know of a vision-language model to build its prompts, read from the
// model's HF directory without loading any weights: the image placeholder token
// (config.json's image_token_index) and how many placeholder tokens one image takes (the
// tower's patches, and the CLS token for vision_feature_select_strategy "full":
// engine/model/vision/vision_config.h, the same parse the worker's tower uses, so both agree; a
// config.json image_seq_length that says otherwise is refused).
//
// A GGUF file or an HF directory whose config.json has no vision_config is a text-only model:
// nullopt. Errors: a LLaVA config the parse refuses, an image token outside the tokenizer's
// vocabulary or not one of its special tokens (the template's "<image>" must tokenize to it).
// Pure functions; thread-safe.

#ifndef FERRY_ROUTER_API_VISION_PROMPT_H_
#define FERRY_ROUTER_API_VISION_PROMPT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/common/token_id.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {

struct VisionPromptSetup {
  TokenId image_token = 0;
  int64_t tokens_per_image = 0;
};

// `model`: the router's --model (a GGUF file or an HF directory), `tokenizer` its tokenizer.
absl::StatusOr<std::optional<VisionPromptSetup>> ReadVisionPromptSetup(const std::string& model,
                                                                       const Tokenizer& tokenizer);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_VISION_PROMPT_H_
