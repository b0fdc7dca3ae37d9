// An image in a request's prompt as the engine takes it (EngineRequest::images): its content hash,
// the absolute prompt positions of its placeholder tokens, and its embeddings, one float32 row of
// the text model's hidden size per placeholder token (the vision tower's and projector's output,
// computed before the request reaches the engine).
//
// Ownership: the embeddings are shared and immutable (shared_ptr<const vector<float>>) and the
// request holds them for its whole life, so every path that recomputes the prompt (preemption
// and recompute, SWA replay, a resumed request) reads the same rows again and never needs the
// image itself. A prefill step takes, for each placeholder position it computes, the image's row
// instead of the token embedding table's (ForwardSequence::input_embeddings, filled by the
// engine); a chunk may start
// or end inside an image.
//
// Block hashes: an image enters the hash of every full block it overlaps (content hash and
// offset, engine/common/block_hash.h), so the prefix cache reuses KV only for the same image at
// the same place. Plain values; thread-compatible.

#ifndef FERRY_ENGINE_PROMPT_IMAGE_H_
#define FERRY_ENGINE_PROMPT_IMAGE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "engine/common/block_hash.h"
#include "engine/common/hash128.h"

namespace ferry {

struct PromptImageInput {
  Hash128 content_hash;
  int64_t placeholder_start = 0;   // absolute position of its first placeholder token
  int64_t placeholder_length = 0;  // placeholder tokens (= embedding rows)
  // placeholder_length x hidden_size floats, row-major. Null: absent, the caller expects every
  // position of the image to come from the prefix cache (the router predicted it cached and sent
  // no rows). A step that must compute any of its positions (the prefix was evicted, a window
  // replay reaches into it, a preempted sequence recomputes it) fails the request Unavailable,
  // before or after its first token: the caller sends it again with the rows.
  std::shared_ptr<const std::vector<float>> embeddings;
};

// The images of a prompt as the block-hash specification sees them (validated requests: sorted,
// not overlapping, inside the prompt).
std::vector<PromptImageSpan> ImageSpans(absl::Span<const PromptImageInput> images);

// The images overlapping block [begin, begin + block_tokens) with their offsets relative to
// `begin`, in prompt order (`images` sorted by start).
std::vector<BlockImage> ImagesInBlock(absl::Span<const PromptImageSpan> images, int64_t begin,
                                      int64_t block_tokens);

}  // namespace ferry

#endif  // FERRY_ENGINE_PROMPT_IMAGE_H_
