#include "engine/sampling/sampling.h"

#include <cmath>
#include <limits>
#include <vector>

#include "engine/common/float_math.h"

namespace ferry {

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double UniformDraw(uint64_t seed, uint64_t choice, uint64_t index) {
  uint64_t z = SplitMix64(seed);
  z = SplitMix64(z ^ choice);
  z = SplitMix64(z ^ index);
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

namespace {

// The largest non-NaN value of x[0..kBlock) and -inf when there is none: lane-wise maxima
// (`a < v ? v : a` never takes a NaN), which the compiler turns into vector compares and blends.
// Exact, so the order of the lanes cannot change the result.
constexpr size_t kBlock = 64;
float BlockMax(const float* x) {
  float lane[16];
  for (int j = 0; j < 16; ++j) lane[j] = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < kBlock; i += 16) {
    for (int j = 0; j < 16; ++j) lane[j] = lane[j] < x[i + j] ? x[i + j] : lane[j];
  }
  for (int w = 8; w > 0; w /= 2) {
    for (int j = 0; j < w; ++j) lane[j] = lane[j] < lane[j + w] ? lane[j + w] : lane[j];
  }
  return lane[0];
}

}  // namespace

TokenId ArgMax(absl::Span<const float> logits) {
  // Block by block, the first block whose maximum beats every earlier one's holds the answer:
  // its first element equal to that maximum. Logits of -inf and NaN only (no block maximum above
  // -inf) fall to the plain scan, which takes the first non-NaN.
  const float* x = logits.data();
  const size_t n = logits.size();
  float best = -std::numeric_limits<float>::infinity();
  size_t best_start = n;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const float m = BlockMax(x + i);
    if (best < m) {
      best = m;
      best_start = i;
    }
  }
  for (; i < n; ++i) {
    if (best < x[i]) {
      best = x[i];
      best_start = i;
    }
  }
  if (best_start < n) {
    for (size_t k = best_start;; ++k) {
      if (x[k] == best) return static_cast<TokenId>(k);
    }
  }
  for (size_t k = 0; k < n; ++k) {
    if (!std::isnan(x[k])) return static_cast<TokenId>(k);
  }
  return 0;
}

TokenId SampleTemperature(absl::Span<const float> logits, float temperature, double u) {
  const TokenId top = ArgMax(logits);
  const float max = logits.empty() ? 0.0f : logits[top];
  if (!std::isfinite(max)) return top;
  thread_local std::vector<float> weights;
  weights.resize(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    weights[i] = std::isnan(logits[i]) ? 0.0f : Exp((logits[i] - max) / temperature);
    total += weights[i];
  }
  const double target = u * total;
  double running = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (weights[i] == 0.0f) continue;
    running += weights[i];
    if (running > target) return static_cast<TokenId>(i);
  }
  return top;  // only by rounding at the very end of the range
}

}  // namespace ferry
