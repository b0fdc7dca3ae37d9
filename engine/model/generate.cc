#include "engine/model/generate.h"

#include <algorithm>

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
  ~BlockTable() { pool_.Release(blocks_).IgnoreError(); }
  // Grows the table to hold `tokens` positions.
  absl::Status Reserve(int64_t tokens) {
    const int64_t need = pool_.layout().BlocksFor(tokens) - static_cast<int64_t>(blocks_.size());
    if (need <= 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<BlockId> more, pool_.Allocate(need));
    blocks_.insert(blocks_.end(), more.begin(), more.end());
    return absl::OkStatus();
  }
  absl::Span<const BlockId> blocks() const { return blocks_; }

 private:
  KvBlockPool& pool_;
  std::vector<BlockId> blocks_;
};

}  // namespace

absl::StatusOr<GenerateResult> Generate(Transformer& model, KvBlockPool& pool,
                                        absl::Span<const TokenId> prompt,
                                        const GenerateOptions& options) {
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
  BlockTable table(pool);
  std::vector<float> logits;

  double start = model_internal::SteadySeconds();
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : prompt_len;
  for (int64_t begin = 0; begin < prompt_len; begin += chunk) {
    const int64_t n = std::min(chunk, prompt_len - begin);
    RETURN_IF_ERROR(table.Reserve(begin + n));
    logits.clear();
    const ForwardSequence seq{prompt.subspan(begin, n), begin, table.blocks(), false};
    RETURN_IF_ERROR(model.Forward({seq}, pool, &logits));
  }
  result.prefill_seconds = model_internal::SteadySeconds() - start;

  start = model_internal::SteadySeconds();
  int64_t position = prompt_len;
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    if (i > 0) {
      RETURN_IF_ERROR(table.Reserve(position + 1));
      const TokenId last = result.tokens.back();
      logits.clear();
      const ForwardSequence seq{absl::MakeConstSpan(&last, 1), position, table.blocks(), false};
      RETURN_IF_ERROR(model.Forward({seq}, pool, &logits));
      ++position;
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
  return result;
}

}  // namespace ferry
