// A generate loop for one request, enough to run a model end to end in tests and tools: prefill
// (in one step or in chunks), then one decode step per token, greedy or seeded temperature
// sampling, stop on a stop token or max_new_tokens. The batching scheduler (engine/engine.h)
// replaces it for serving.

#ifndef FERRY_ENGINE_MODEL_GENERATE_H_
#define FERRY_ENGINE_MODEL_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/token_id.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/transformer.h"

namespace ferry {

struct GenerateOptions {
  int64_t max_new_tokens = 16;
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 0;         // for temperature > 0: output position i draws UniformDraw(seed, 0, i)
  std::vector<TokenId> stop_token_ids;
  int64_t prefill_chunk = 0;  // tokens per prefill step; 0: the whole prompt in one step
  bool keep_logits = false;   // return the logits each token was chosen from
};

struct GenerateResult {
  std::vector<TokenId> tokens;     // generated, including a final stop token
  bool stopped = false;            // ended on a stop token (else on max_new_tokens)
  int64_t window_blocks_peak = 0;  // with a window pool: the most window blocks held at once
  std::vector<std::vector<float>> logits;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Runs `prompt` (non-empty) through `model` with KV blocks from `pool`, which are all released
// before returning. A hybrid model may keep its sliding-window layers in `window_pool`
// (Transformer::WindowKvLayoutFor; `pool` then has FullKvLayoutFor's layout): blocks that fall
// out of every window are released as the sequence grows, so it holds at most
// ceil((window + prefill_chunk) / block_tokens) + 1 of them.
absl::StatusOr<GenerateResult> Generate(Transformer& model, KvBlockPool& pool,
                                        absl::Span<const TokenId> prompt,
                                        const GenerateOptions& options,
                                        KvBlockPool* window_pool = nullptr);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_GENERATE_H_
