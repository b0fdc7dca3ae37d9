#include "engine/sampling/sampling.h"

#include <cmath>
#include <map>
#include <vector>

#include "engine/common/float_math.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(SamplingTest, SplitMix64MatchesTheReferenceSequence) {
  // Vigna's splitmix64.c with state 0: next() returns these (state advances by the constant
  // before mixing, as SplitMix64(x) does with x = previous state).
  EXPECT_EQ(SplitMix64(0), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(SplitMix64(0x9E3779B97F4A7C15ull), 0x6E789E6AA1B965F4ull);
}

TEST(SamplingTest, UniformDrawIsAPureFunctionOfSeedChoiceIndex) {
  EXPECT_EQ(UniformDraw(42, 0, 7), UniformDraw(42, 0, 7));
  EXPECT_NE(UniformDraw(42, 0, 7), UniformDraw(42, 0, 8));
  EXPECT_NE(UniformDraw(42, 0, 7), UniformDraw(42, 1, 7));
  EXPECT_NE(UniformDraw(42, 0, 7), UniformDraw(43, 0, 7));
  double sum = 0;
  for (int i = 0; i < 100000; ++i) {
    const double u = UniformDraw(1, 0, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
}

TEST(SamplingTest, ArgMaxTakesTheLowestIndexAmongEqualsAndSkipsNan) {
  EXPECT_EQ(ArgMax(std::vector<float>{1, 3, 3, 2}), 1u);
  EXPECT_EQ(ArgMax(std::vector<float>{NAN, -1, NAN, -0.5f}), 3u);
  EXPECT_EQ(ArgMax(std::vector<float>{-INFINITY, -INFINITY}), 0u);
}

// The definition, one element at a time: the first non-NaN element not smaller than any other.
TokenId ArgMaxByDefinition(const std::vector<float>& x) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) continue;
    bool largest = true;
    for (size_t j = 0; j < x.size() && largest; ++j) largest = std::isnan(x[j]) || x[j] <= x[i];
    if (largest) return static_cast<TokenId>(i);
  }
  return 0;
}

TEST(SamplingTest, ArgMaxAgreesWithItsDefinitionAcrossBlockEdgesTiesNansAndInfinities) {
  uint64_t r = 7;
  auto next = [&] { return r = SplitMix64(r); };
  const float specials[] = {NAN, -INFINITY, INFINITY, 0.0f, -0.0f, 5.0f};
  for (int round = 0; round < 3000; ++round) {
    const size_t n = next() % 300;
    std::vector<float> x(n);
    const int mode = static_cast<int>(next() % 4);
    for (float& v : x) {
      const uint64_t u = next();
      if (mode == 0) {
        v = static_cast<float>(u % 1000) / 7.0f - 70.0f;  // distinct-ish values
      } else if (mode == 1) {
        v = static_cast<float>(u % 4);  // many ties
      } else if (mode == 2) {
        v = specials[u % 6];
      } else {
        v = (u % 3 == 0) ? NAN : -INFINITY;  // nothing above -inf
      }
    }
    ASSERT_EQ(ArgMax(x), ArgMaxByDefinition(x)) << "round " << round << " n " << n;
  }
}

TEST(SamplingTest, TemperatureSamplingFollowsTheSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -3.0f};
  const float t = 0.7f;
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp((logits[i] - 2.0) / t);
  std::map<TokenId, int> counts;
  const int n = 200000;
  for (int i = 0; i < n; ++i) ++counts[SampleTemperature(logits, t, UniformDraw(9, 0, i))];
  for (size_t i = 0; i < logits.size(); ++i) {
    EXPECT_NEAR(counts[i] / double{n}, p[i] / z, 0.005) << i;
  }
  // The inverse CDF at known points, computed here from the documented definition.
  double total = 0;
  for (float l : logits) total += Exp((l - 2.0f) / t);
  const double first = Exp((1.0f - 2.0f) / t) / total;
  EXPECT_EQ(SampleTemperature(logits, t, first * 0.999), 0u);
  EXPECT_EQ(SampleTemperature(logits, t, first * 1.001), 1u);
  EXPECT_EQ(SampleTemperature(logits, t, 0.999999), 3u);
}

}  // namespace
}  // namespace ferry
