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

TokenId ArgMax(absl::Span<const float> logits) {
  size_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i])) continue;
    if (!found || logits[i] > best_value) {
      best = i;
      best_value = logits[i];
      found = true;
    }
  }
  return static_cast<TokenId>(best);
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
