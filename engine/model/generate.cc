#include "engine/model/generate.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/model/host_weights.h"  // model_internal::SteadySeconds
#include "engine/sampling/sampling.h"

namespace ferry {
namespace {

// The request's blocks, released however Generate returns.
class BlockTable {
 public:
  explicit BlockTable(KvBlockPool& pool) : pool_(pool) {}
  ~BlockTable() {
    std::vector<BlockId> held;
    for (BlockId b : blocks_) {
      if (b != kNoBlock) held.push_back(b);
    }
    pool_.Release(held).IgnoreError();
  }
  // Grows the table to hold `tokens` positions.
  absl::Status Reserve(int64_t tokens) {
    const int64_t need = pool_.layout().BlocksFor(tokens) - static_cast<int64_t>(blocks_.size());
    if (need <= 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<BlockId> more, pool_.Allocate(need));
    blocks_.insert(blocks_.end(), more.begin(), more.end());
    held_ += need;
    peak_ = std::max(peak_, held_);
    return absl::OkStatus();
  }
  // Releases the blocks wholly before position `first` (a window table).
  absl::Status ReleaseBefore(int64_t first) {
    const int64_t bt = pool_.layout().block_tokens;
    for (int64_t i = 0; i < static_cast<int64_t>(blocks_.size()) && (i + 1) * bt <= first; ++i) {
      if (blocks_[i] == kNoBlock) continue;
      RETURN_IF_ERROR(pool_.Release(absl::MakeConstSpan(&blocks_[i], 1)));
      blocks_[i] = kNoBlock;
      --held_;
    }
    return absl::OkStatus();
  }
  absl::Span<const BlockId> blocks() const { return blocks_; }
  int64_t peak() const { return peak_; }

 private:
  KvBlockPool& pool_;
  std::vector<BlockId> blocks_;
  int64_t held_ = 0, peak_ = 0;
};

}  // namespace

absl::StatusOr<GenerateResult> Generate(Transformer& model, KvBlockPool& pool,
                                        absl::Span<const TokenId> prompt,
                                        const GenerateOptions& options, KvBlockPool* window_pool) {
  if (prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  if (options.max_new_tokens < 1) return absl::InvalidArgumentError("max_new_tokens must be >= 1");
  if (options.temperature < 0 || !(options.temperature == options.temperature)) {
    return absl::InvalidArgumentError("temperature must be >= 0");
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  if (prompt_len + options.max_new_tokens - 1 > model.max_positions()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", prompt_len, " tokens) + max_new_tokens (", options.max_new_tokens,
                     ") exceed the model's ", model.max_positions(), " positions"));
  }
  const int64_t vocab = model.config().vocab_size;
  GenerateResult result;
  std::vector<float> logits;
  BlockTable table(pool);
  std::optional<BlockTable> window;
  if (window_pool != nullptr) window.emplace(*window_pool);
  // Both tables hold `tokens` positions; the window table drops what no later row can see.
  auto reserve = [&](int64_t tokens) -> absl::Status {
    RETURN_IF_ERROR(table.Reserve(tokens));
    if (window) RETURN_IF_ERROR(window->Reserve(tokens));
    return absl::OkStatus();
  };
  auto slide = [&](int64_t next_position) -> absl::Status {
    if (!window) return absl::OkStatus();
    return window->ReleaseBefore(next_position + 1 - model.max_window());
  };
  auto step = [&](absl::Span<const TokenId> tokens, int64_t start, bool no_logits) {
    ForwardSequence seq{tokens, start, table.blocks(), false};
    seq.no_logits = no_logits;
    if (window) seq.window_blocks = window->blocks();
    return model.Forward({seq}, pool, &logits, window_pool);
  };

  double start = model_internal::SteadySeconds();
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : prompt_len;
  for (int64_t begin = 0; begin < prompt_len; begin += chunk) {
    const int64_t n = std::min(chunk, prompt_len - begin);
    RETURN_IF_ERROR(reserve(begin + n));
    logits.clear();
    RETURN_IF_ERROR(step(prompt.subspan(begin, n), begin, begin + n < prompt_len));
    RETURN_IF_ERROR(slide(begin + n));
  }
  result.prefill_seconds = model_internal::SteadySeconds() - start;

  start = model_internal::SteadySeconds();
  int64_t position = prompt_len;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (i > 0) {
      RETURN_IF_ERROR(reserve(position + 1));
      const TokenId last = result.tokens.back();
      logits.clear();
      RETURN_IF_ERROR(step(absl::MakeConstSpan(&last, 1), position, false));
      ++position;
      RETURN_IF_ERROR(slide(position));
    }
    const absl::Span<const float> row(logits.data(), vocab);
    const TokenId token =
        options.temperature == 0
            ? ArgMax(row)
            : SampleTemperature(row, options.temperature, UniformDraw(options.seed, 0, i));
    if (options.keep_logits) result.logits.emplace_back(row.begin(), row.end());
    result.tokens.push_back(token);
    if (std::find(options.stop_token_ids.begin(), options.stop_token_ids.end(), token) !=
        options.stop_token_ids.end()) {
      result.stopped = true;
      break;
    }
  }
  result.decode_seconds = model_internal::SteadySeconds() - start;
  if (window) result.window_blocks_peak = window->peak();
  return result;
}

}  // namespace ferry
