// The engine's view of a model (engine.h): what it needs to schedule sequences on a paged KV cache
// and to run one step over a batch of them. This is the model seam of ARCHITECTURE.md §1's
// `--engine=real|null|sim`: Transformer (the real model on a Backend) and NullModel (a
// deterministic token source with configured timing, for front-door benchmarks and scripted API
// tests) implement it, and the engine, its scheduler, KV accounting, prefix cache and events are
// the same whichever runs underneath.
//
// Not thread-safe: one engine thread owns a model.

#ifndef FERRY_ENGINE_MODEL_FORWARD_MODEL_H_
#define FERRY_ENGINE_MODEL_FORWARD_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "engine/common/token_id.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/model_config.h"

namespace ferry {

// A run of a step's new tokens whose input rows come from elsewhere (an image's embeddings,
// engine/prompt_image.h) instead of the token embedding table: tokens [offset, offset + rows)
// of the step take the rows at `data`.
struct InputEmbeddingRows {
  int64_t offset = 0;
  int64_t rows = 0;
  const float* data = nullptr;  // rows x hidden_size floats, valid for the Forward call
};

struct ForwardSequence {
  absl::Span<const TokenId> tokens;  // this step's new tokens, at least one
  int64_t start_position = 0;        // tokens of the sequence already in the cache
  absl::Span<const BlockId> blocks;  // the block table; covers start_position + tokens.size()
  bool all_logits = false;           // logits for every new token, else for the last only
  bool no_logits = false;            // none at all (a prefill chunk that does not end a prompt)
  // With a window pool (Forward's window_kv): the sliding-window layers' block table, indexed
  // like `blocks`; blocks wholly before every window (or before window_floor) may be kNoBlock.
  absl::Span<const BlockId> window_blocks;
  // A replay of the window layers (engine.h "SWA replay"; window pool only). Rows at positions
  // before replay_end recompute the window layers' KV but leave the full-attention layers' as
  // it is in `blocks` (read, never written); the window layers see no key before window_floor
  // (the history the replay starts from). 0: no replay.
  int64_t replay_end = 0;
  int64_t window_floor = 0;
  // Runs of `tokens` whose input rows replace the embedding table's, sorted, not overlapping,
  // inside `tokens`. Models without an embedding table (NullModel) ignore them.
  absl::Span<const InputEmbeddingRows> input_embeddings;
  // Set (the last token's logits only): nothing but the row's greedy token is wanted (the
  // sampler's greedy choice, Backend::ArgMaxRows). A model whose backend chooses it writes it
  // here and appends no logits row for the sequence; otherwise it leaves it untouched and
  // appends the row as usual. The caller sets it to kNoToken first.
  TokenId* greedy_token = nullptr;
};

class ForwardModel {
 public:
  virtual ~ForwardModel() = default;

  // vocab_size, max_position_embeddings and eos_token_ids are what the engine reads.
  virtual const ModelConfig& config() const = 0;
  // Enters every block hash through the root (engine/common/block_hash.h).
  virtual const Hash128& fingerprint() const = 0;
  // Positions the model accepts (its max_position_embeddings).
  int64_t max_positions() const { return config().max_position_embeddings; }

  // The layout of this model's KV blocks: every layer in one pool.
  virtual KvBlockLayout KvLayoutFor(int32_t block_tokens) const = 0;
  // A hybrid model (sliding-window and full-attention layers) may keep its window layers' KV in
  // a pool of their own: the full-attention layers' layout and the window layers' layout. Both
  // have num_layers 0 unless the model has layers of both kinds.
  virtual KvBlockLayout FullKvLayoutFor(int32_t block_tokens) const = 0;
  virtual KvBlockLayout WindowKvLayoutFor(int32_t block_tokens) const = 0;
  // The largest sliding window of any layer (0: none).
  virtual int32_t max_window() const = 0;
  // The positions a replay must recompute, ending at position P, for every sliding-window
  // layer's KV at P - max_window() + 1 .. P - 1 to be exact when the full-attention layers' KV
  // is read from the cache: a window layer's KV at p depends on the layer's input at p, and a
  // window layer's output at p on its KV at p - window + 1 .. p, so each window layer adds
  // (window - 1) positions; full-attention layers add none. The sum of (window - 1) over the
  // window layers (0: none).
  virtual int64_t exact_replay_tokens() const = 0;

  // Runs one step over `batch`. Appends to `logits` one row of vocab_size floats per requested
  // position (every new token of a sequence with all_logits, none with no_logits, else its
  // last), in batch order. Invalid input (token ids, positions past max_positions, short block
  // tables, a pool of another layout) is an InvalidArgument error and changes nothing. With
  // `window_kv` (a hybrid model), `kv` has FullKvLayoutFor's layout, window_kv
  // WindowKvLayoutFor's, and every sequence its window_blocks.
  virtual absl::Status Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                               std::vector<float>* logits, KvBlockPool* window_kv = nullptr) = 0;

  // Mixture-of-experts models: tokens routed to each expert since creation, [layer][expert]
  // (empty rows for dense layers; empty for models without experts).
  virtual const std::vector<std::vector<int64_t>>& expert_token_counts() const = 0;
};

// Whether two layouts describe the same blocks.
inline bool SameKvLayout(const KvBlockLayout& a, const KvBlockLayout& b) {
  return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
         a.head_dim == b.head_dim && a.dtype == b.dtype && a.block_tokens == b.block_tokens;
}

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_FORWARD_MODEL_H_
