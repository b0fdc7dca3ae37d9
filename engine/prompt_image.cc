#include "engine/prompt_image.h"

namespace ferry {

std::vector<PromptImageSpan> ImageSpans(absl::Span<const PromptImageInput> images) {
  std::vector<PromptImageSpan> spans;
  spans.reserve(images.size());
  for (const PromptImageInput& image : images) {
    spans.push_back({image.content_hash, static_cast<uint32_t>(image.placeholder_start),
                     static_cast<uint32_t>(image.placeholder_length)});
  }
  return spans;
}

std::vector<BlockImage> ImagesInBlock(absl::Span<const PromptImageSpan> images, int64_t begin,
                                      int64_t block_tokens) {
  std::vector<BlockImage> out;
  const int64_t end = begin + block_tokens;
  for (const PromptImageSpan& image : images) {
    const int64_t start = image.start, stop = start + int64_t{image.length};
    if (start >= end) break;
    if (stop <= begin) continue;
    out.push_back({image.content_hash, static_cast<int32_t>(start - begin)});
  }
  return out;
}

}  // namespace ferry
