#include "engine/sampling/sampler.h"

#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "engine/common/float_math.h"
#include "engine/sampling/sampling.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

const PromptTokenSet kNoPrompt;

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(SamplerTest, GreedyAfterBiasAndPenaltiesMatchesTheFormulas) {
  // Written from the header: bias, then repetition (prompt or output), then frequency/presence.
  const std::vector<float> logits = {2.0f, 1.9f, -0.5f, 1.0f, 1.85f, -3.0f};
  SamplingParams p = Greedy();
  EXPECT_EQ(Sample(logits, p, kNoPrompt, {}, 0).token, 0);
  p.logit_bias = {{3, 1.5f}};  // 1.0 + 1.5 = 2.5 wins
  EXPECT_EQ(Sample(logits, p, kNoPrompt, {}, 0).token, 3);
  p.repetition_penalty = 2.0f;  // token 3 in the prompt: 2.5 / 2 = 1.25; token 0 now wins
  EXPECT_EQ(Sample(logits, p, PromptTokenSet{3}, {}, 0).token, 0);
  SamplerState state;
  state.Observe(0);  // 2.0 / 2 = 1.0: then 1.9 (token 1) wins
  EXPECT_EQ(Sample(logits, p, PromptTokenSet{3}, state, 0).token, 1);
  p.repetition_penalty = 1.0f;
  p.logit_bias.clear();
  p.frequency_penalty = 0.1f;  // token 0 seen twice: 2.0 - 0.2 = 1.8 < 1.9
  state.Observe(0);
  EXPECT_EQ(Sample(logits, p, kNoPrompt, state, 0).token, 1);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.12f;  // 2.0 - 0.12 = 1.88 < 1.9
  EXPECT_EQ(Sample(logits, p, kNoPrompt, state, 0).token, 1);
  p.presence_penalty = 0.05f;  // 1.95 > 1.9
  EXPECT_EQ(Sample(logits, p, kNoPrompt, state, 0).token, 0);
  // A negative logit is multiplied by the repetition penalty (pushed further down).
  const std::vector<float> negative = {-1.0f, -1.5f};
  SamplingParams r = Greedy();
  r.repetition_penalty = 2.0f;
  EXPECT_EQ(Sample(negative, r, PromptTokenSet{0}, {}, 0).token, 1);  // -2.0 < -1.5
  // NaN is never chosen; ties go to the lowest index.
  EXPECT_EQ(Sample(std::vector<float>{NAN, 1.0f, 1.0f}, Greedy(), kNoPrompt, {}, 0).token, 1);
}

// Greedy without bias or penalties skips the sampler's working copy of the logits; a bias of 0 on
// token 0 changes no value and takes the full path: the two agree, NaNs and infinities included.
TEST(SamplerTest, PlainGreedyPicksWhatTheFullPathPicks) {
  SamplingParams biased = Greedy();
  biased.logit_bias = {{0, 0.0f}};
  const std::vector<std::vector<float>> cases = {
      {NAN, -INFINITY},         {-INFINITY, NAN}, {NAN, NAN},   {-INFINITY, -INFINITY},
      {NAN, 2.0f, INFINITY, 3}, {-0.0f, 0.0f},    {1, 3, 3, 2}, {NAN, -INFINITY, -5.0f},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(Sample(c, Greedy(), kNoPrompt, {}, 0).token,
              Sample(c, biased, kNoPrompt, {}, 0).token);
  }
  std::vector<float> large(49152, -30.0f);
  large[49151] = 8.0f;
  large[20000] = 8.0f;
  EXPECT_EQ(Sample(large, Greedy(), kNoPrompt, {}, 0).token, 20000);
}

// The draw of the header, written out: candidates in index order, weights Exp((l - max) / T),
// first whose running sum (double) exceeds u * total.
TokenId DirectDraw(const std::vector<float>& l, const std::vector<int>& kept, float temperature,
                   double u) {
  float max = -INFINITY;
  for (int t : kept) max = std::max(max, l[t]);
  double total = 0;
  for (int t : kept) total += Exp((l[t] - max) / temperature);
  double running = 0;
  for (int t : kept) {
    running += Exp((l[t] - max) / temperature);
    if (running > u * total) return t;
  }
  return kept.back();
}

TEST(SamplerTest, TemperatureTopKTopPMinPAgainstDirectComputation) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -1.0f, 2.0f, 0.0f};
  const float t = 0.8f;
  // Probabilities at T = 0.8 ranked: 1 (3.0), 4 (2.5), 2 (2.0), 6 (2.0), 0, 3, 7, 5.
  std::vector<double> w(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += (w[i] = Exp((logits[i] - 3.0f) / t));
  struct Case {
    int32_t top_k;
    float top_p, min_p;
    std::vector<int> kept;  // in index order
  };
  const double p1 = w[1] / total, p4 = w[4] / total;
  const std::vector<Case> cases = {
      {0, 1.0f, 0.0f, {0, 1, 2, 3, 4, 5, 6, 7}},
      {3, 1.0f, 0.0f, {1, 2, 4}},  // token 2 beats 6 on the tie (lower index)
      {0, static_cast<float>(p1 + p4 * 0.5), 0.0f, {1, 4}},
      {0, static_cast<float>(p1 * 0.9), 0.0f, {1}},
      {0, 1.0f, static_cast<float>(w[2] * 0.99), {1, 2, 4, 6}},  // p >= min_p * p_max
      {3, static_cast<float>((w[1] + w[4]) / (w[1] + w[4] + w[2]) * 0.99), 0.0f, {1, 4}},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = 1234;
    std::map<TokenId, int> seen;
    SamplerState state;
    for (int i = 0; i < 400; ++i) {
      const TokenId got = Sample(logits, p, kNoPrompt, state, 2).token;
      EXPECT_EQ(got, DirectDraw(logits, c.kept, t, UniformDraw(1234, 2, i)))
          << "top_k " << c.top_k << " top_p " << c.top_p << " min_p " << c.min_p << " i " << i;
      ++seen[got];
      state.Observe(got);  // moves the output position; no penalties are set
    }
    EXPECT_EQ(seen.size(), c.kept.size());
  }
}

TEST(SamplerTest, ChoicesDifferUnderOneSeedAndRepeatExactly) {
  const std::vector<float> flat(100, 0.0f);
  SamplingParams p;
  p.seed = 7;
  std::set<TokenId> firsts;
  for (uint64_t c = 0; c < 8; ++c) firsts.insert(Sample(flat, p, kNoPrompt, {}, c).token);
  EXPECT_GE(firsts.size(), 6u);
  EXPECT_EQ(Sample(flat, p, kNoPrompt, {}, 3).token, Sample(flat, p, kNoPrompt, {}, 3).token);
}

TEST(SamplerTest, LogprobsAreTheRawLogSoftmaxWithTopN) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  SamplingParams p = Greedy();
  p.top_logprobs = 3;
  p.logit_bias = {{4, 50.0f}};  // changes the choice, not the reported distribution
  const SampledToken s = Sample(logits, p, kNoPrompt, {}, 0);
  double sum = 0;
  for (float v : logits) sum += std::exp(double{v});
  auto lp = [&](int t) { return static_cast<float>(logits[t] - std::log(sum)); };
  EXPECT_EQ(s.token, 4);
  EXPECT_NEAR(s.logprob, lp(4), 1e-6);
  ASSERT_EQ(s.top.size(), 3u);
  EXPECT_EQ(s.top[0].first, 1);  // tie with 3: lower index first
  EXPECT_EQ(s.top[1].first, 3);
  EXPECT_EQ(s.top[2].first, 4);
  EXPECT_NEAR(s.top[0].second, lp(1), 1e-6);
  p.top_logprobs = -1;
  EXPECT_TRUE(Sample(logits, p, kNoPrompt, {}, 0).top.empty());
}

TEST(SamplerTest, ValidateNamesTheField) {
  SamplingParams p;
  EXPECT_TRUE(p.Validate(10).ok());
  auto message = [](const SamplingParams& q) { return std::string(q.Validate(10).message()); };
  p.temperature = -1;
  EXPECT_NE(message(p).find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(message(p).find("top_p"), std::string::npos);
  p = {};
  p.min_p = 1.5f;
  EXPECT_NE(message(p).find("min_p"), std::string::npos);
  p = {};
  p.frequency_penalty = 3;
  EXPECT_NE(message(p).find("frequency_penalty"), std::string::npos);
  p = {};
  p.logit_bias = {{10, 1.0f}};
  EXPECT_NE(message(p).find("outside the vocabulary"), std::string::npos);
  p = {};
  p.logit_bias = {{1, 101.0f}};
  EXPECT_NE(message(p).find("[-100, 100]"), std::string::npos);
  p = {};
  p.top_logprobs = kMaxTopLogprobs + 1;
  EXPECT_NE(message(p).find("top_logprobs"), std::string::npos);
  p = {};
  p.top_k = -2;
  EXPECT_NE(message(p).find("top_k"), std::string::npos);
}

TEST(SamplerTest, StateRoundTripsAndRejectsCorruptBytes) {
  SamplerState state;
  for (TokenId t : {5, 9, 5, 1000, 5}) state.Observe(t);
  const std::string bytes = state.Serialize();
  auto back = SamplerState::Parse(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, state);
  EXPECT_EQ(back->count(5), 3);
  EXPECT_EQ(back->generated(), 5);
  EXPECT_FALSE(SamplerState::Parse(bytes.substr(0, 10)).ok());
  EXPECT_FALSE(SamplerState::Parse(bytes + "x").ok());
  std::string bad = bytes;
  bad[8] = 9;  // generated no longer equals the counts' total
  EXPECT_FALSE(SamplerState::Parse(bad).ok());
  bad = bytes;
  bad[0] = 'X';
  EXPECT_FALSE(SamplerState::Parse(bad).ok());
}

TEST(SamplerTest, FromCountsChecksTheTotalsAndSuppressedTokensAreNeverChosen) {
  absl::flat_hash_map<TokenId, int32_t> counts = {{5, 3}, {9, 1}};
  auto state = SamplerState::FromCounts(4, counts);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->generated(), 4);
  EXPECT_EQ(state->count(5), 3);
  EXPECT_FALSE(SamplerState::FromCounts(5, counts).ok());
  EXPECT_FALSE(SamplerState::FromCounts(0, {{1, 0}}).ok());
  EXPECT_FALSE(SamplerState::FromCounts(-1, {}).ok());

  std::vector<float> logits = {0.f, 3.f, 9.f, 1.f};
  SamplingParams greedy;
  greedy.temperature = 0;
  const TokenId banned[] = {2, 1};
  EXPECT_EQ(Sample(logits, greedy, kNoPrompt, SamplerState(), 0).token, 2u);
  EXPECT_EQ(Sample(logits, greedy, kNoPrompt, SamplerState(), 0, banned).token, 3u);
  SamplingParams hot;
  hot.temperature = 5;
  hot.seed = 7;
  hot.top_logprobs = 0;
  for (int c = 0; c < 50; ++c) {
    const SampledToken t = Sample(logits, hot, kNoPrompt, SamplerState(), c, banned);
    EXPECT_TRUE(t.token == 0 || t.token == 3) << t.token;
  }
  // Nothing else left: the suppression yields.
  std::vector<float> two = {-std::numeric_limits<float>::infinity(), 1.f};
  const TokenId only[] = {1};
  EXPECT_EQ(Sample(two, greedy, kNoPrompt, SamplerState(), 0, only).token, 1u);
}

TEST(SamplerTest, AllowedMaskIsAMaskedArgmaxAndKeepsRawLogprobs) {
  // 40 tokens (two mask words); token 37 has the largest logit but only 3, 20 and 35 are allowed.
  std::vector<float> logits(40, 0.f);
  logits[37] = 9.f;
  logits[20] = 2.f;
  logits[3] = 5.f;
  logits[35] = 5.f;
  std::vector<uint32_t> mask(2, 0);
  for (int t : {3, 20, 35}) mask[t / 32] |= 1u << (t % 32);
  SamplingParams greedy = Greedy();
  greedy.top_logprobs = 1;
  const SampledToken g = Sample(logits, greedy, kNoPrompt, SamplerState(), 0, {}, mask);
  EXPECT_EQ(g.token, 3u);  // the lowest index among the allowed maxima
  // Logprobs are the raw distribution's: token 37 stays the top one.
  ASSERT_EQ(g.top.size(), 1u);
  EXPECT_EQ(g.top[0].first, 37u);
  const SampledToken free = Sample(logits, greedy, kNoPrompt, SamplerState(), 0);
  EXPECT_NEAR(g.logprob, free.top[0].second - 4.f, 1e-4);
  SamplingParams hot;
  hot.temperature = 2;
  hot.seed = 3;
  std::set<TokenId> seen;
  for (int c = 0; c < 100; ++c) {
    const TokenId t = Sample(logits, hot, kNoPrompt, SamplerState(), c, {}, mask).token;
    EXPECT_TRUE(t == 3 || t == 20 || t == 35) << t;
    seen.insert(t);
    // The same seed and position: the same token.
    EXPECT_EQ(Sample(logits, hot, kNoPrompt, SamplerState(), c, {}, mask).token, t);
  }
  EXPECT_EQ(seen.size(), 3u);
  // A mask allowing only a suppressed token: the suppression yields, the mask does not.
  std::vector<uint32_t> only35(2, 0);
  only35[1] = 1u << 3;
  const TokenId banned[] = {35};
  EXPECT_EQ(Sample(logits, greedy, kNoPrompt, SamplerState(), 0, banned, only35).token, 35u);
}

}  // namespace
}  // namespace ferry
