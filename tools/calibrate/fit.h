// The fitter behind tools/calibrate: the compute coefficients of the simulated engine's timing
// model (engine/model/sim_timing.h) from measured step times, and a link's or a store's latency
// and bandwidth from measured transfers.
//
// A step's time is linear in six coefficients: each multiplies one of the step's terms
// (StepTerms: a constant, the prefill rows' new tokens and attention pairs, whether any row
// decodes, the decoding rows, the KV tokens they read). The fit is non-negative least squares on
// RELATIVE error: each step's residual is divided by its measured time, so a 10 ms decode step
// counts as much as a 2 s prefill. An absolute fit would spend its freedom on the long steps and
// leave the short ones, most of a serving run's steps, wrong by multiples. Non-negative because
// every coefficient is a cost: a negative one would make some shape faster by adding work.
//
// Thread-compatible: plain functions of their arguments.

#ifndef FERRY_TOOLS_CALIBRATE_FIT_H_
#define FERRY_TOOLS_CALIBRATE_FIT_H_

#include <array>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/sim_timing.h"

namespace ferry {

// What each coefficient of sim_timing.h's step formula multiplies, for one step.
struct StepTerms {
  double prefill_tokens = 0;  // new tokens of the prefill rows
  // Attention pairs of the prefill rows: n x start + n x (n + 1) / 2 each.
  double prefill_pairs = 0;
  double decode = 0;            // 1 when any row decodes, else 0
  double decode_rows = 0;       // rows with one token
  double decode_kv_tokens = 0;  // KV tokens the decoding rows read: start + 1 each
};

// A row with one token decodes (as StepInfo counts it), any other prefills.
StepTerms StepTermsOf(absl::Span<const SimRow> rows);

// The six compute coefficients, in the order of their terms (kStepCoefficientNames).
inline constexpr int kStepCoefficients = 6;
using StepCoefficients = std::array<double, kStepCoefficients>;
// "step_overhead_s", "prefill_token_s", "prefill_attention_s", "decode_step_s", "decode_row_s",
// "decode_kv_token_s": SimCalibration's field names.
extern const std::array<const char*, kStepCoefficients> kStepCoefficientNames;

// The terms as a row of the design matrix: 1, prefill tokens, pairs, decode, rows, KV tokens.
StepCoefficients TermVector(const StepTerms& terms);
double PredictStepSeconds(const StepCoefficients& coefficients, const StepTerms& terms);

// The compute fields of a calibration, and back.
StepCoefficients CoefficientsOf(const SimCalibration& calibration);
void SetCoefficients(const StepCoefficients& coefficients, SimCalibration* calibration);

struct StepSample {
  StepTerms terms;
  double seconds = 0;  // measured; > 0
};

struct StepFit {
  StepCoefficients coefficients = {};
  // |predicted - measured| / measured over the samples.
  double mean_abs_relative_error = 0;
  double max_abs_relative_error = 0;
};

// Fits the coefficients to `samples` (non-negative, relative error). A coefficient whose term is
// zero in every sample (no decode samples, say) comes out 0. InvalidArgument without samples or
// with a sample whose time is not positive and finite.
absl::StatusOr<StepFit> FitStepCoefficients(absl::Span<const StepSample> samples);

// Moving `bytes` took `seconds` (a KV transfer, a KV store read).
struct MovementSample {
  double bytes = 0;
  double seconds = 0;  // > 0
};

struct MovementFit {
  double latency_s = 0;
  double bytes_per_s = 0;  // 0: the bytes cost nothing measurable (SimCalibration's "instant")
  double mean_abs_relative_error = 0;
};

// Fits seconds = latency_s + bytes / bytes_per_s (both non-negative) on relative error, as
// FitStepCoefficients does. InvalidArgument without samples or with a time not positive.
absl::StatusOr<MovementFit> FitLatencyAndBandwidth(absl::Span<const MovementSample> samples);

// argmin ||A x - b||_2 subject to x >= 0, for A with at most 16 columns (row-major, every row as
// long as the first). Exact: it solves the unconstrained problem on every support (subset of
// columns), keeps the solutions that are non-negative, and returns the best; columns that are
// zero or linearly dependent on the others in a support make that support's solution not count
// (the minimum is reached on a support of independent columns). Columns are scaled to unit norm
// before solving, so terms of very different magnitudes (tokens against attention pairs) are
// solved as accurately as the data allows.
absl::StatusOr<std::vector<double>> NonNegativeLeastSquares(
    const std::vector<std::vector<double>>& a, const std::vector<double>& b);

}  // namespace ferry

#endif  // FERRY_TOOLS_CALIBRATE_FIT_H_
