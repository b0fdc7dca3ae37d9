#include "engine/model/vision/image_placeholders.h"

#include "absl/strings/str_cat.h"

namespace ferry {

absl::StatusOr<ExpandedPrompt> ExpandImagePlaceholders(absl::Span<const TokenId> tokens,
                                                       TokenId image_token,
                                                       int64_t num_image_tokens, int64_t num_images,
                                                       int64_t max_tokens) {
  if (num_image_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("image placeholders: ", num_image_tokens, " tokens per image"));
  }
  int64_t found = 0;
  for (TokenId t : tokens) found += t == image_token;
  if (found != num_images) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt has ", found, " image token", found == 1 ? "" : "s", " (id ",
                     image_token, ") for ", num_images, " image", num_images == 1 ? "" : "s"));
  }
  const int64_t size = static_cast<int64_t>(tokens.size());
  // size + found * (num_image_tokens - 1) > max_tokens, without overflow.
  const bool over =
      size > max_tokens || (found > 0 && num_image_tokens - 1 > (max_tokens - size) / found);
  if (over) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt with its ", found, " image", found == 1 ? "" : "s", " expanded is over ",
        max_tokens, " tokens (", size, " tokens, ", num_image_tokens, " per image)"));
  }
  ExpandedPrompt out;
  out.tokens.reserve(size + found * (num_image_tokens - 1));
  for (TokenId t : tokens) {
    if (t != image_token) {
      out.tokens.push_back(t);
      continue;
    }
    out.images.push_back({static_cast<int64_t>(out.tokens.size()), num_image_tokens});
    out.tokens.insert(out.tokens.end(), num_image_tokens, image_token);
  }
  return out;
}

}  // namespace ferry
