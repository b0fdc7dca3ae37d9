// Token choice from logits: greedy and seeded temperature sampling (the full sampler with top-k/p,
// penalties and stop strings comes with the scheduler).
//
// Randomness is position-keyed (ARCHITECTURE.md §4): the uniform draw for output position
// `index` of choice `choice` of a request with `seed` is UniformDraw(seed, choice, index), a pure
// function, so a request sampled alone, in a batch, or resumed elsewhere draws the same numbers:
//
//   z = SplitMix64(seed); z = SplitMix64(z ^ choice); z = SplitMix64(z ^ index)
//   UniformDraw = (z >> 11) * 2^-53                      in [0, 1)
//
// where SplitMix64(x) is the finalizer of Steele et al.'s SplitMix64 applied to
// x + 0x9E3779B97F4A7C15 (Vigna's reference constants 0xBF58476D1CE4E5B9, 0x94D049BB133111EB).
//
// SampleTemperature(logits, T, u): weights w_i = Exp((l_i - max) / T) with the engine's Exp
// (float), total = the sum of w_i in increasing i (double); returns the first i whose running sum
// (double, increasing i) exceeds u * total.

#ifndef FERRY_ENGINE_SAMPLING_SAMPLING_H_
#define FERRY_ENGINE_SAMPLING_SAMPLING_H_

#include <cstdint>

#include "absl/types/span.h"
#include "engine/common/token_id.h"

namespace ferry {

uint64_t SplitMix64(uint64_t x);
double UniformDraw(uint64_t seed, uint64_t choice, uint64_t index);

// The index of the largest logit; the lowest index among equals. NaNs are never chosen (all-NaN
// gives 0).
TokenId ArgMax(absl::Span<const float> logits);

// Requires temperature > 0 and u in [0, 1).
TokenId SampleTemperature(absl::Span<const float> logits, float temperature, double u);

}  // namespace ferry

#endif  // FERRY_ENGINE_SAMPLING_SAMPLING_H_
