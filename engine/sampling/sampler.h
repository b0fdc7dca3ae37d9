// The full sampler: what a request asks of token choice (SamplingParams), the per-choice state
// that a resumed request carries along (SamplerState), and one Sample() per output position.
//
// Sample(logits, params, state, choice), step by step (l = a float copy of the logits):
//   1. logit_bias:          l[t] += bias[t]
//   2. repetition_penalty:  for t in prompt or output so far: l[t] = l[t] > 0 ? l[t] / r
//                                                                              : l[t] * r
//   3. frequency/presence:  for t in output so far, c = its count: l[t] -= c * frequency
//                                                                          + presence
//      allowed mask:        l[t] = -inf for every t whose bit is clear (a grammar constraint:
//                           bit t % 32 of word t / 32); then temperature 0 is the masked argmax
//      suppressed tokens:   l[t] = -inf (the engine's min_tokens: end-of-sequence and stop ids
//                           cannot be chosen before the request's minimum output), unless
//                           nothing else is left (the mask allows only them)
//   4. temperature 0:       the token is ArgMax(l) (lowest index among equals); done.
//   5. otherwise the candidates are all tokens with finite l, ranked by (l desc, index asc):
//      top_k > 0 keeps the first top_k; then p_t = Exp((l_t - l_max) / T) / sum (Exp = the
//      engine's float Exp, sums in double in rank order); top_p < 1 keeps the shortest ranked
//      prefix whose running sum of p reaches top_p; min_p > 0 keeps those with
//      p_t >= min_p * p_max; the draw u = UniformDraw(seed, choice, index) picks the first kept
//      candidate in rank order whose running sum of p exceeds u * (sum of kept p).
//   6. logprobs (when asked): log-softmax of the raw logits in double (the model's
//      distribution, as OpenAI-compatible servers report by default): the chosen token's and the
//      top N (ranked by value desc, index asc).
// `index` is the output position (state.generated()), so the draw of position i of choice c is a
// pure function of (seed, c, i): the same alone, in any batch, or resumed elsewhere.

#ifndef FERRY_ENGINE_SAMPLING_SAMPLER_H_
#define FERRY_ENGINE_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/token_id.h"

namespace ferry {

// The most top logprobs a request may ask for per position.
inline constexpr int32_t kMaxTopLogprobs = 20;

struct SamplingParams {
  float temperature = 1.0f;                           // 0: greedy
  int32_t top_k = 0;                                  // 0: off
  float top_p = 1.0f;                                 // (0, 1]
  float min_p = 0.0f;                                 // [0, 1]
  float repetition_penalty = 1.0f;                    // > 0; 1: off
  float frequency_penalty = 0.0f;                     // [-2, 2]
  float presence_penalty = 0.0f;                      // [-2, 2]
  std::vector<std::pair<TokenId, float>> logit_bias;  // bias in [-100, 100]
  uint64_t seed = 0;
  int32_t top_logprobs = -1;  // -1: no logprobs; 0..kMaxTopLogprobs: chosen token's + top N

  // InvalidArgument with the offending field for anything out of range.
  absl::Status Validate(int64_t vocab_size) const;
};

// What a choice has produced so far: the penalties' counts and the output position. Exported as
// bytes with the request when it moves, and restored on the other side.
class SamplerState {
 public:
  void Observe(TokenId token);
  int64_t generated() const { return generated_; }
  int32_t count(TokenId token) const;
  const absl::flat_hash_map<TokenId, int32_t>& counts() const { return counts_; }

  std::string Serialize() const;
  static absl::StatusOr<SamplerState> Parse(std::string_view bytes);
  // From its parts (a resume point received over the wire): `counts` of each generated token,
  // which must be positive and add up to `generated`.
  static absl::StatusOr<SamplerState> FromCounts(
      int64_t generated, const absl::flat_hash_map<TokenId, int32_t>& counts);

  bool operator==(const SamplerState& other) const {
    return generated_ == other.generated_ && counts_ == other.counts_;
  }

 private:
  int64_t generated_ = 0;
  absl::flat_hash_map<TokenId, int32_t> counts_;
};

struct SampledToken {
  TokenId token = 0;
  float logprob = 0;                           // when logprobs were asked
  std::vector<std::pair<TokenId, float>> top;  // top N (token, logprob)
};

// The prompt's distinct tokens, for the repetition penalty (computed once per request).
using PromptTokenSet = absl::flat_hash_set<TokenId>;

// One output position. `logits` has the vocabulary's size; params must be valid; `suppressed`
// tokens (in the vocabulary) are never chosen, unless nothing else can be. `allowed`, when not
// empty, is a bitmask of (vocabulary size + 31) / 32 words: only tokens whose bit is set can be
// chosen (the caller makes sure one is; with none, the result is as if every logit were -inf).
// Logprobs stay those of the raw logits.
SampledToken Sample(absl::Span<const float> logits, const SamplingParams& params,
                    const PromptTokenSet& prompt_tokens, const SamplerState& state, uint64_t choice,
                    absl::Span<const TokenId> suppressed = {},
                    absl::Span<const uint32_t> allowed = {});

}  // namespace ferry

#endif  // FERRY_ENGINE_SAMPLING_SAMPLER_H_
