#include "engine/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/common/float_math.h"
#include "engine/common/le_encoding.h"
#include "engine/common/log.h"
#include "engine/sampling/sampling.h"

namespace ferry {
namespace {

constexpr uint32_t kStateMagic = 0x53525346;  // "FSRS"
constexpr uint32_t kStateVersion = 1;

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) { return GetU32(p) | static_cast<uint64_t>(GetU32(p + 4)) << 32; }

bool InRange(float v, float lo, float hi) { return v >= lo && v <= hi; }

// Rank order: larger value first, lower index among equals.
struct Ranked {
  const float* l;
  bool operator()(int32_t a, int32_t b) const { return l[a] > l[b] || (l[a] == l[b] && a < b); }
};

// w[t] = Exp((l[t] - max) / temperature) for each candidate t; returns their sum, in double and
// in candidate order. Built twice: for any x86-64, where each of Exp's fused multiply-adds is a
// call into libm (about 1 ms a row over a 49k vocabulary), and with FMA, where it is one
// instruction. fma is exactly rounded either way, so both give bit-identical weights.
#define FERRY_FILL_WEIGHTS_BODY             \
  double total = 0;                         \
  for (const int32_t t : candidates) {      \
    w[t] = Exp((l[t] - max) / temperature); \
    total += w[t];                          \
  }                                         \
  return total;

double FillWeightsGeneric(const std::vector<int32_t>& candidates, const float* l, float max,
                          float temperature, float* w) {
  FERRY_FILL_WEIGHTS_BODY
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) double FillWeightsFma(const std::vector<int32_t>& candidates,
                                                          const float* l, float max,
                                                          float temperature, float* w) {
  FERRY_FILL_WEIGHTS_BODY
}
#endif
#undef FERRY_FILL_WEIGHTS_BODY

double FillWeights(const std::vector<int32_t>& candidates, const float* l, float max,
                   float temperature, float* w) {
#if defined(__x86_64__)
  static const bool fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (fma) return FillWeightsFma(candidates, l, max, temperature, w);
#endif
  return FillWeightsGeneric(candidates, l, max, temperature, w);
}

}  // namespace

absl::Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!(temperature >= 0) || !std::isfinite(temperature)) {
    return absl::InvalidArgumentError("temperature must be a finite number >= 0");
  }
  if (top_k < 0) return absl::InvalidArgumentError("top_k must be >= 0 (0 disables it)");
  if (!(top_p > 0 && top_p <= 1)) return absl::InvalidArgumentError("top_p must be in (0, 1]");
  if (!InRange(min_p, 0, 1)) return absl::InvalidArgumentError("min_p must be in [0, 1]");
  if (!(repetition_penalty > 0) || !std::isfinite(repetition_penalty)) {
    return absl::InvalidArgumentError("repetition_penalty must be a finite number > 0");
  }
  if (!InRange(frequency_penalty, -2, 2)) {
    return absl::InvalidArgumentError("frequency_penalty must be in [-2, 2]");
  }
  if (!InRange(presence_penalty, -2, 2)) {
    return absl::InvalidArgumentError("presence_penalty must be in [-2, 2]");
  }
  for (const auto& [token, bias] : logit_bias) {
    if (token >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias: token ", token, " is outside the vocabulary (", vocab_size, " tokens)"));
    }
    if (!InRange(bias, -100, 100)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: the bias of token ", token, " must be in [-100, 100]"));
    }
  }
  if (top_logprobs < -1 || top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs must be in [0, ", kMaxTopLogprobs, "]"));
  }
  return absl::OkStatus();
}

void SamplerState::Observe(TokenId token) {
  ++counts_[token];
  ++generated_;
}

int32_t SamplerState::count(TokenId token) const {
  auto it = counts_.find(token);
  return it == counts_.end() ? 0 : it->second;
}

std::string SamplerState::Serialize() const {
  // magic, version, generated (u64), entries (u32), then (token i32, count i32) by token.
  std::vector<std::pair<TokenId, int32_t>> sorted(counts_.begin(), counts_.end());
  std::sort(sorted.begin(), sorted.end());
  std::string out;
  AppendU32Le(&out, kStateMagic);
  AppendU32Le(&out, kStateVersion);
  AppendU64Le(&out, static_cast<uint64_t>(generated_));
  AppendU32Le(&out, static_cast<uint32_t>(sorted.size()));
  for (const auto& [token, count] : sorted) {
    AppendU32Le(&out, static_cast<uint32_t>(token));
    AppendU32Le(&out, static_cast<uint32_t>(count));
  }
  return out;
}

absl::StatusOr<SamplerState> SamplerState::Parse(std::string_view bytes) {
  auto bad = [](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("sampler state: ", what));
  };
  if (bytes.size() < 20) return bad("truncated header");
  if (GetU32(bytes.data()) != kStateMagic) return bad("bad magic");
  if (GetU32(bytes.data() + 4) != kStateVersion) return bad("unsupported version");
  SamplerState state;
  const uint64_t generated = GetU64(bytes.data() + 8);
  const uint32_t entries = GetU32(bytes.data() + 16);
  if (bytes.size() != 20 + 8 * static_cast<uint64_t>(entries)) return bad("wrong length");
  if (generated > (uint64_t{1} << 40)) return bad("implausible output count");
  state.generated_ = static_cast<int64_t>(generated);
  uint64_t total = 0;
  for (uint32_t i = 0; i < entries; ++i) {
    const auto token = static_cast<TokenId>(GetU32(bytes.data() + 20 + 8 * i));
    const auto count = static_cast<int32_t>(GetU32(bytes.data() + 24 + 8 * i));
    if (count <= 0) return bad("bad entry");
    if (!state.counts_.emplace(token, count).second) return bad("duplicate token");
    total += static_cast<uint64_t>(count);
  }
  if (total != generated) return bad("counts do not add up to the output count");
  return state;
}

absl::StatusOr<SamplerState> SamplerState::FromCounts(
    int64_t generated, const absl::flat_hash_map<TokenId, int32_t>& counts) {
  if (generated < 0 || generated > (int64_t{1} << 40)) {
    return absl::InvalidArgumentError("sampler state: implausible output count");
  }
  int64_t total = 0;
  for (const auto& [token, count] : counts) {
    if (count <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampler state: token ", token, " has count ", count));
    }
    total += count;
  }
  if (total != generated) {
    return absl::InvalidArgumentError(absl::StrCat("sampler state: counts add up to ", total,
                                                   ", not to the output count ", generated));
  }
  SamplerState state;
  state.generated_ = generated;
  state.counts_ = counts;
  return state;
}

namespace {

// `out` with its logprob and top logprobs, when asked: log-softmax of the raw logits.
SampledToken WithLogprobs(absl::Span<const float> logits, const SamplingParams& params,
                          SampledToken out) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params.top_logprobs >= 0) {
    double max = -std::numeric_limits<double>::infinity();
    for (float v : logits) {
      if (!std::isnan(v)) max = std::max(max, static_cast<double>(v));
    }
    double sum = 0;
    for (float v : logits) {
      if (!std::isnan(v)) sum += std::exp(static_cast<double>(v) - max);
    }
    const double lse = max + std::log(sum);
    auto logprob = [&](TokenId t) {
      return std::isnan(logits[t]) ? -std::numeric_limits<float>::infinity()
                                   : static_cast<float>(static_cast<double>(logits[t]) - lse);
    };
    out.logprob = logprob(out.token);
    if (params.top_logprobs > 0) {
      thread_local std::vector<int32_t> order;
      order.resize(vocab);
      for (int32_t t = 0; t < vocab; ++t) order[t] = t;
      thread_local std::vector<float> raw;
      raw.assign(logits.begin(), logits.end());
      for (float& v : raw) {
        if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
      }
      const int32_t n = std::min(params.top_logprobs, vocab);
      std::partial_sort(order.begin(), order.begin() + n, order.end(), Ranked{raw.data()});
      for (int32_t i = 0; i < n; ++i) out.top.emplace_back(order[i], logprob(order[i]));
    }
  }
  return out;
}

}  // namespace

SampledToken Sample(absl::Span<const float> logits, const SamplingParams& params,
                    const PromptTokenSet& prompt_tokens, const SamplerState& state, uint64_t choice,
                    absl::Span<const TokenId> suppressed, absl::Span<const uint32_t> allowed) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  SampledToken out;
  if (params.temperature == 0.0f && params.logit_bias.empty() &&
      params.repetition_penalty == 1.0f && params.frequency_penalty == 0.0f &&
      params.presence_penalty == 0.0f && suppressed.empty() && allowed.empty() && vocab > 0) {
    // Greedy on the logits as they are (the common case, without the copy below): the same
    // token, since a NaN is never the maximum and nothing above -inf means token 0 either way.
    out.token = ArgMax(logits);
    if (!(logits[out.token] > -std::numeric_limits<float>::infinity())) out.token = 0;
    return WithLogprobs(logits, params, out);
  }
  thread_local std::vector<float> l;
  l.assign(logits.begin(), logits.end());
  for (float& v : l) {
    if (std::isnan(v)) v = -std::numeric_limits<float>::infinity();
  }
  for (const auto& [token, bias] : params.logit_bias) l[token] += bias;
  if (params.repetition_penalty != 1.0f) {
    auto penalize = [&](TokenId t) {
      l[t] = l[t] > 0 ? l[t] / params.repetition_penalty : l[t] * params.repetition_penalty;
    };
    for (TokenId t : prompt_tokens) penalize(t);
    for (const auto& [t, count] : state.counts()) {
      if (!prompt_tokens.contains(t)) penalize(t);
    }
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (const auto& [t, count] : state.counts()) {
      l[t] -= static_cast<float>(count) * params.frequency_penalty + params.presence_penalty;
    }
  }
  if (!allowed.empty()) {
    CHECK_GE(allowed.size(), (static_cast<size_t>(vocab) + 31) / 32);
    for (int32_t t = 0; t < vocab; ++t) {
      if (!((allowed[t >> 5] >> (t & 31)) & 1u)) l[t] = -std::numeric_limits<float>::infinity();
    }
  }
  if (!suppressed.empty()) {
    bool other = false;  // is anything left to choose?
    thread_local std::vector<char> banned;
    banned.assign(vocab, 0);
    for (TokenId t : suppressed) banned[t] = 1;
    for (int32_t t = 0; t < vocab && !other; ++t) {
      other = !banned[t] && l[t] > -std::numeric_limits<float>::infinity();
    }
    if (other) {
      for (TokenId t : suppressed) l[t] = -std::numeric_limits<float>::infinity();
    }
  }

  if (params.temperature == 0.0f) {
    out.token = ArgMax(l);
  } else {
    thread_local std::vector<int32_t> candidates;
    candidates.clear();
    for (int32_t t = 0; t < vocab; ++t) {
      if (std::isfinite(l[t])) candidates.push_back(t);
    }
    const Ranked ranked{l.data()};
    if (params.top_k > 0 && params.top_k < static_cast<int32_t>(candidates.size())) {
      std::partial_sort(candidates.begin(), candidates.begin() + params.top_k, candidates.end(),
                        ranked);
      candidates.resize(params.top_k);
      std::sort(candidates.begin(), candidates.end());  // back to index order
    }
    if (candidates.empty()) {
      out.token = ArgMax(l);
    } else {
      float max = -std::numeric_limits<float>::infinity();
      for (int32_t t : candidates) max = std::max(max, l[t]);
      thread_local std::vector<float> w;
      w.assign(vocab, 0.0f);
      const double total = FillWeights(candidates, l.data(), max, params.temperature, w.data());
      if (params.top_p < 1.0f) {
        // The shortest ranked prefix reaching top_p: rank a growing head until it does.
        const double target = static_cast<double>(params.top_p) * total;
        size_t head = std::min<size_t>(64, candidates.size());
        while (true) {
          std::partial_sort(candidates.begin(), candidates.begin() + head, candidates.end(),
                            ranked);
          double running = 0;
          size_t keep = 0;
          while (keep < head && running < target) running += w[candidates[keep++]];
          if (running >= target || head == candidates.size()) {
            candidates.resize(std::max<size_t>(keep, 1));
            break;
          }
          head = std::min(candidates.size(), head * 8);
        }
        std::sort(candidates.begin(), candidates.end());
      }
      if (params.min_p > 0.0f) {
        // p_t >= min_p * p_max, with p_max = w = 1 at the largest logit.
        std::vector<int32_t> kept;
        for (int32_t t : candidates) {
          if (w[t] >= params.min_p) kept.push_back(t);
        }
        if (!kept.empty()) candidates.swap(kept);
      }
      double kept_total = 0;
      for (int32_t t : candidates) kept_total += w[t];
      const double target = UniformDraw(params.seed, choice, state.generated()) * kept_total;
      out.token = candidates.back();  // only by rounding at the very end of the range
      double running = 0;
      for (int32_t t : candidates) {
        running += w[t];
        if (running > target) {
          out.token = t;
          break;
        }
      }
    }
  }

  return WithLogprobs(logits, params, out);
}

}  // namespace ferry
