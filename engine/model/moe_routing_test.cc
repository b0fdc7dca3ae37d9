// Routing against computations written out from the header's definition (double-precision
// softmax / sigmoid, explicit group choice), on logits chosen so that every choice is clear.

#include "engine/model/moe_routing.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ferry {
namespace {

MoeConfig Experts(int64_t n, int64_t k) {
  MoeConfig m;
  m.num_experts = n;
  m.experts_per_token = k;
  m.expert_intermediate_size = 8;
  return m;
}

std::vector<RoutedExpert> Route(const std::vector<float>& logits, const MoeConfig& m) {
  std::vector<RoutedExpert> out;
  RouteToken(logits.data(), m, &out);
  return out;
}

std::vector<double> Softmax(const std::vector<float>& l) {
  double max = l[0], sum = 0;
  for (float v : l) max = std::max(max, double{v});
  std::vector<double> p;
  for (float v : l) sum += std::exp(v - max);
  for (float v : l) p.push_back(std::exp(v - max) / sum);
  return p;
}

void Expect(const std::vector<RoutedExpert>& got, const std::vector<int>& experts,
            const std::vector<double>& weights) {
  ASSERT_EQ(got.size(), experts.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].expert, experts[i]) << i;
    EXPECT_NEAR(got[i].weight, weights[i], 1e-6 * std::max(1.0, weights[i])) << i;
  }
}

TEST(MoeRoutingTest, SoftmaxTopKRenormalisedOrNotAndScaled) {
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.5f, -1.0f, 2.5f};
  const auto p = Softmax(l);
  MoeConfig m = Experts(6, 2);
  Expect(Route(l, m), {1, 5}, {p[1], p[5]});  // Qwen2-MoE: the probabilities as they are
  m.norm_topk_prob = true;                    // Mixtral: renormalised over the chosen
  Expect(Route(l, m), {1, 5}, {p[1] / (p[1] + p[5]), p[5] / (p[1] + p[5])});
  m.routed_scaling_factor = 2.5;
  Expect(Route(l, m), {1, 5}, {2.5 * p[1] / (p[1] + p[5]), 2.5 * p[5] / (p[1] + p[5])});
  // Equal logits: the lower expert id.
  const std::vector<float> tie = {0.0f, 1.0f, 1.0f, 1.0f};
  Expect(Route(tie, Experts(4, 2)), {1, 2}, {Softmax(tie)[1], Softmax(tie)[2]});
}

TEST(MoeRoutingTest, SigmoidScoresWithACorrectionBiasForTheChoiceOnly) {
  const std::vector<float> l = {0.2f, -0.4f, 1.5f, 0.9f};
  auto sig = [](float x) { return 1.0 / (1.0 + std::exp(-double{x})); };
  MoeConfig m = Experts(4, 2);
  m.scoring = MoeConfig::Scoring::kSigmoid;
  m.norm_topk_prob = true;
  m.routed_scaling_factor = 2.0;
  Expect(Route(l, m), {2, 3},
         {2 * sig(1.5f) / (sig(1.5f) + sig(0.9f)), 2 * sig(0.9f) / (sig(1.5f) + sig(0.9f))});
  // A bias that lifts expert 1 over expert 3 changes the choice, not the weights' source.
  m.score_bias = {0.0f, 0.6f, 0.0f, 0.0f};
  Expect(Route(l, m), {1, 2},
         {2 * sig(-0.4f) / (sig(-0.4f) + sig(1.5f)), 2 * sig(1.5f) / (sig(-0.4f) + sig(1.5f))});
}

TEST(MoeRoutingTest, GroupLimitedChoice) {
  // Groups of two: {0,1} {2,3} {4,5} {6,7}.
  const std::vector<float> l = {5.0f, 4.9f, 1.0f, 0.0f, 2.0f, 0.0f, 4.95f, 0.0f};
  const auto p = Softmax(l);
  MoeConfig m = Experts(8, 2);
  Expect(Route(l, m), {0, 6}, {p[0], p[6]});  // no groups
  m.num_groups = 4;
  m.top_groups = 1;  // by each group's best: group 0 alone
  Expect(Route(l, m), {0, 1}, {p[0], p[1]});
  m.top_groups = 2;  // groups 0 and 3
  Expect(Route(l, m), {0, 6}, {p[0], p[6]});
  // Top-two sums (DeepSeek-V3: sigmoid scores): group 1's {3, 2.9} beats group 0's {5, 0},
  // whose best expert alone wins on the maximum.
  const std::vector<float> t = {5.0f, 0.0f, 3.0f, 2.9f, 0.0f, 0.0f, 0.0f, 0.0f};
  auto sig = [](float x) { return 1.0 / (1.0 + std::exp(-double{x})); };
  m.scoring = MoeConfig::Scoring::kSigmoid;
  m.top_groups = 1;
  m.group_score = MoeConfig::GroupScore::kMax;
  Expect(Route(t, m), {0, 1}, {sig(5.0f), sig(0.0f)});
  m.group_score = MoeConfig::GroupScore::kTopTwoSum;
  Expect(Route(t, m), {2, 3}, {sig(3.0f), sig(2.9f)});
}

TEST(MoeRoutingTest, ConfigValidation) {
  ModelConfig c;
  c.vocab_size = 10, c.hidden_size = 8, c.intermediate_size = 8, c.num_layers = 1;
  c.num_heads = 2, c.num_kv_heads = 1, c.head_dim = 4;
  c.moe = Experts(8, 2);
  EXPECT_TRUE(c.Validate().ok());
  c.moe.num_groups = 3;  // 8 experts do not split into 3 groups
  EXPECT_FALSE(c.Validate().ok());
  c.moe.num_groups = 4;
  c.moe.top_groups = 5;
  EXPECT_FALSE(c.Validate().ok());
  c.moe.top_groups = 1;
  c.moe.experts_per_token = 3;  // one group of two cannot give three
  EXPECT_FALSE(c.Validate().ok());
  c.moe.experts_per_token = 2;
  c.moe.score_bias = {1.0f};
  EXPECT_FALSE(c.Validate().ok());
}

}  // namespace
}  // namespace ferry
