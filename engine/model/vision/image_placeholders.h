// Image placeholder expansion, as transformers' LlavaProcessor (4.47.1) does it: the rendered
// prompt holds one image token per image (the chat template's `<image>`), and the processor
// replaces each with num_image_tokens copies in the text before tokenizing. The image token is
// an added special token, so the tokenizer always cuts the text around it and never merges it
// with a neighbour: expanding the token ids after tokenization gives the same ids, which is what
// this does (no tokenizer needed).
//
// ExpandImagePlaceholders returns the expanded ids and, per image in prompt order, the span of
// its placeholder tokens (PromptImageInput's placeholder_start / placeholder_length). The number
// of image tokens must equal the number of images (InvalidArgument otherwise, as the processor's
// model refuses "Image features and image tokens do not match"); the expanded prompt must fit
// in max_tokens. Pure function; thread-safe.

#ifndef FERRY_ENGINE_MODEL_VISION_IMAGE_PLACEHOLDERS_H_
#define FERRY_ENGINE_MODEL_VISION_IMAGE_PLACEHOLDERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/token_id.h"

namespace ferry {

struct ImagePlaceholderSpan {
  int64_t start = 0;   // absolute position of the first placeholder token
  int64_t length = 0;  // = num_image_tokens
};

struct ExpandedPrompt {
  std::vector<TokenId> tokens;
  std::vector<ImagePlaceholderSpan> images;  // in prompt order
};

absl::StatusOr<ExpandedPrompt> ExpandImagePlaceholders(absl::Span<const TokenId> tokens,
                                                       TokenId image_token,
                                                       int64_t num_image_tokens, int64_t num_images,
                                                       int64_t max_tokens);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_VISION_IMAGE_PLACEHOLDERS_H_
