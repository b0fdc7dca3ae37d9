// The calibration fitter: exact samples from known coefficients give them back, noisy samples
// stay close, and no coefficient ever comes out negative.

#include "tools/calibrate/fit.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

// Coefficients of the magnitude the CPU engine shows (a 135M model on two cores).
constexpr StepCoefficients kTruth = {2e-3, 1.2e-4, 1.5e-8, 8e-3, 4e-4, 6e-8};

// Step shapes like tools/calibrate's design: prefill rows after a start, decode batches, and
// decode rows with one prefill chunk.
std::vector<std::vector<SimRow>> DesignShapes() {
  std::vector<std::vector<SimRow>> shapes;
  for (int64_t n : {16, 64, 256, 1024}) {
    for (int64_t start : {0, 1024, 4096}) shapes.push_back({{start, n}});
  }
  for (int64_t b : {1, 4, 16, 64}) {
    for (int64_t k : {64, 512, 2048}) shapes.push_back(std::vector<SimRow>(b, SimRow{k, 1}));
  }
  for (int64_t b : {4, 16, 64}) {
    for (int64_t start : {0, 512}) {
      std::vector<SimRow> rows(b, SimRow{1024, 1});
      rows.push_back({start, 256});
      shapes.push_back(rows);
    }
  }
  return shapes;
}

std::vector<StepSample> Samples(const StepCoefficients& truth, double noise, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-noise, noise);
  std::vector<StepSample> samples;
  for (const auto& rows : DesignShapes()) {
    StepSample s;
    s.terms = StepTermsOf(rows);
    s.seconds = PredictStepSeconds(truth, s.terms) * (1 + u(rng));
    samples.push_back(s);
  }
  return samples;
}

TEST(StepTermsTest, CountsPrefillAndDecodeRowsAsTheTimingModelDoes) {
  const std::vector<SimRow> rows = {{100, 1}, {7, 1}, {0, 4}, {10, 3}};
  const StepTerms t = StepTermsOf(rows);
  EXPECT_EQ(t.decode, 1);
  EXPECT_EQ(t.decode_rows, 2);
  EXPECT_EQ(t.decode_kv_tokens, 101 + 8);
  EXPECT_EQ(t.prefill_tokens, 7);
  // 4 x 0 + 4 x 5 / 2, then 3 x 10 + 3 x 4 / 2.
  EXPECT_EQ(t.prefill_pairs, 10 + 36);
  const StepTerms prefill_only = StepTermsOf(std::vector<SimRow>{{0, 16}});
  EXPECT_EQ(prefill_only.decode, 0);
  EXPECT_EQ(prefill_only.decode_rows, 0);
}

TEST(FitTest, ExactSamplesGiveTheCoefficientsBack) {
  const absl::StatusOr<StepFit> fit = FitStepCoefficients(Samples(kTruth, 0, 1));
  ASSERT_TRUE(fit.ok()) << fit.status();
  for (int i = 0; i < kStepCoefficients; ++i) {
    EXPECT_NEAR(fit->coefficients[i], kTruth[i], 1e-6 * kTruth[i]) << kStepCoefficientNames[i];
  }
  EXPECT_LT(fit->mean_abs_relative_error, 1e-9);
  EXPECT_LT(fit->max_abs_relative_error, 1e-9);
}

TEST(FitTest, AZeroCoefficientComesBackZeroNotNegative) {
  StepCoefficients truth = kTruth;
  truth[5] = 0;  // KV reads free
  truth[3] = 0;  // no per-step decode cost
  const absl::StatusOr<StepFit> fit = FitStepCoefficients(Samples(truth, 0, 1));
  ASSERT_TRUE(fit.ok()) << fit.status();
  for (int i = 0; i < kStepCoefficients; ++i) {
    EXPECT_GE(fit->coefficients[i], 0) << kStepCoefficientNames[i];
    EXPECT_NEAR(fit->coefficients[i], truth[i], 1e-6 * kTruth[i]) << kStepCoefficientNames[i];
  }
}

TEST(FitTest, NoisySamplesStayClose) {
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    const absl::StatusOr<StepFit> fit = FitStepCoefficients(Samples(kTruth, 0.05, seed));
    ASSERT_TRUE(fit.ok()) << fit.status();
    // The predictions: within the noise.
    EXPECT_LT(fit->mean_abs_relative_error, 0.05) << "seed " << seed;
    // The coefficients that dominate some shape: within 20%.
    for (int i : {0, 1, 2, 3, 4}) {
      EXPECT_NEAR(fit->coefficients[i], kTruth[i], 0.2 * kTruth[i])
          << kStepCoefficientNames[i] << " seed " << seed;
    }
    // The KV read cost is small next to the rest of a decode step here: it only has to be in
    // range, and non-negative.
    EXPECT_GE(fit->coefficients[5], 0);
    EXPECT_LT(fit->coefficients[5], 3 * kTruth[5]);
    // Every shape's prediction stays close to the true time.
    for (const auto& rows : DesignShapes()) {
      const StepTerms t = StepTermsOf(rows);
      const double truth = PredictStepSeconds(kTruth, t);
      EXPECT_NEAR(PredictStepSeconds(fit->coefficients, t), truth, 0.08 * truth) << "seed " << seed;
    }
  }
}

TEST(FitTest, DataThatWantsANegativeCoefficientGetsNone) {
  // Mixed steps far cheaper than their parts: an unconstrained fit would make decode_step_s
  // negative.
  StepCoefficients truth = kTruth;
  truth[3] = -5e-3;
  truth[0] = 1e-2;
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    std::vector<StepSample> samples = Samples(truth, 0.02, seed);
    const absl::StatusOr<StepFit> fit = FitStepCoefficients(samples);
    ASSERT_TRUE(fit.ok()) << fit.status();
    for (int i = 0; i < kStepCoefficients; ++i) {
      EXPECT_GE(fit->coefficients[i], 0) << kStepCoefficientNames[i];
    }
    EXPECT_EQ(fit->coefficients[3], 0);
  }
}

TEST(FitTest, WithoutDecodeSamplesTheDecodeCoefficientsAreZero) {
  std::vector<StepSample> samples;
  for (int64_t n : {16, 64, 256, 1024}) {
    for (int64_t start : {0, 1024, 4096}) {
      StepSample s;
      s.terms = StepTermsOf(std::vector<SimRow>{{start, n}});
      s.seconds = PredictStepSeconds(kTruth, s.terms);
      samples.push_back(s);
    }
  }
  const absl::StatusOr<StepFit> fit = FitStepCoefficients(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(fit->coefficients[i], kTruth[i], 1e-6 * kTruth[i]);
  for (int i = 3; i < kStepCoefficients; ++i) EXPECT_EQ(fit->coefficients[i], 0);
}

TEST(FitTest, BadSamplesAreRefused) {
  EXPECT_EQ(FitStepCoefficients({}).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<StepSample> samples = Samples(kTruth, 0, 1);
  samples[3].seconds = 0;
  EXPECT_EQ(FitStepCoefficients(samples).status().code(), absl::StatusCode::kInvalidArgument);
  samples[3].seconds = std::nan("");
  EXPECT_EQ(FitStepCoefficients(samples).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(MovementFitTest, LatencyAndBandwidthComeBack) {
  const double latency = 50e-6, bandwidth = 2e9;
  std::vector<MovementSample> samples;
  for (double bytes : {4096.0, 1.5e6, 6e6, 2.4e7, 9.4e7}) {
    samples.push_back({bytes, latency + bytes / bandwidth});
  }
  absl::StatusOr<MovementFit> fit = FitLatencyAndBandwidth(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->latency_s, latency, 1e-9 * latency);
  EXPECT_NEAR(fit->bytes_per_s, bandwidth, 1e-6 * bandwidth);
  EXPECT_LT(fit->mean_abs_relative_error, 1e-9);
  // Noise of 10% either way: still the right magnitudes, never negative.
  for (size_t i = 0; i < samples.size(); ++i) samples[i].seconds *= i % 2 == 0 ? 1.1 : 0.9;
  fit = FitLatencyAndBandwidth(samples);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->latency_s, latency, 0.2 * latency);
  EXPECT_NEAR(fit->bytes_per_s, bandwidth, 0.2 * bandwidth);
  // Bigger transfers no slower than small ones: latency only, bandwidth "instant" (0).
  fit = FitLatencyAndBandwidth({{4096, 1e-3}, {1e8, 0.9e-3}});
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_GT(fit->latency_s, 0);
  EXPECT_EQ(fit->bytes_per_s, 0);
  EXPECT_FALSE(FitLatencyAndBandwidth({}).ok());
  EXPECT_FALSE(FitLatencyAndBandwidth({{4096, 0}}).ok());
}

TEST(NonNegativeLeastSquaresTest, ClipsAtZeroAndRefitsTheRest) {
  // x0 + x1 = 1, x0 - x1 = 3, x1 = -1 (unconstrained: x = (2, -1)); with x1 >= 0 the best is
  // x1 = 0 and x0 the mean of 1 and 3.
  const absl::StatusOr<std::vector<double>> x =
      NonNegativeLeastSquares({{1, 1}, {1, -1}, {0, 1}}, {1, 3, -1});
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_NEAR((*x)[0], 2, 1e-12);
  EXPECT_EQ((*x)[1], 0);
}

TEST(NonNegativeLeastSquaresTest, DependentColumnsStillGiveTheMinimum) {
  // Column 1 is twice column 0: any split fits exactly; the answer must fit exactly too.
  const absl::StatusOr<std::vector<double>> x =
      NonNegativeLeastSquares({{1, 2}, {2, 4}, {3, 6}}, {2, 4, 6});
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_GE((*x)[0], 0);
  EXPECT_GE((*x)[1], 0);
  EXPECT_NEAR((*x)[0] + 2 * (*x)[1], 2, 1e-12);
}

TEST(NonNegativeLeastSquaresTest, RefusesMalformedInput) {
  EXPECT_FALSE(NonNegativeLeastSquares({}, {}).ok());
  EXPECT_FALSE(NonNegativeLeastSquares({{1, 2}, {1}}, {1, 2}).ok());
  EXPECT_FALSE(NonNegativeLeastSquares({{1}}, {1, 2}).ok());
  EXPECT_FALSE(NonNegativeLeastSquares({{std::nan("")}}, {1}).ok());
  EXPECT_FALSE(NonNegativeLeastSquares({std::vector<double>(17, 1.0)}, {1}).ok());
}

}  // namespace
}  // namespace ferry
