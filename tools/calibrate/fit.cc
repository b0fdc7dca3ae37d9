#include "tools/calibrate/fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

// Columns whose pivot falls below this (relative to unit-norm columns) are dependent.
constexpr double kRankTolerance = 1e-9;
constexpr int kMaxColumns = 16;

// The least-squares solution on columns `support` of `a` (already scaled to unit norm), by
// Householder QR; nullopt when those columns are not linearly independent.
std::optional<std::vector<double>> SolveOnSupport(const std::vector<std::vector<double>>& a,
                                                  const std::vector<double>& b,
                                                  const std::vector<int>& support) {
  const size_t m = a.size(), k = support.size();
  if (k > m) return std::nullopt;
  std::vector<std::vector<double>> r(m, std::vector<double>(k));
  for (size_t i = 0; i < m; ++i) {
    for (size_t j = 0; j < k; ++j) r[i][j] = a[i][support[j]];
  }
  std::vector<double> qb = b;
  for (size_t j = 0; j < k; ++j) {
    double norm = 0;
    for (size_t i = j; i < m; ++i) norm += r[i][j] * r[i][j];
    norm = std::sqrt(norm);
    if (norm <= kRankTolerance) return std::nullopt;
    const double alpha = r[j][j] > 0 ? -norm : norm;
    std::vector<double> v(m - j);
    for (size_t i = j; i < m; ++i) v[i - j] = r[i][j];
    v[0] -= alpha;
    double v2 = 0;
    for (double x : v) v2 += x * x;
    if (v2 > 0) {
      // H = I - 2 v v^T / (v^T v) on the remaining columns and on b.
      for (size_t c = j; c < k; ++c) {
        double dot = 0;
        for (size_t i = j; i < m; ++i) dot += v[i - j] * r[i][c];
        const double f = 2 * dot / v2;
        for (size_t i = j; i < m; ++i) r[i][c] -= f * v[i - j];
      }
      double dot = 0;
      for (size_t i = j; i < m; ++i) dot += v[i - j] * qb[i];
      const double f = 2 * dot / v2;
      for (size_t i = j; i < m; ++i) qb[i] -= f * v[i - j];
    }
    if (std::abs(r[j][j]) <= kRankTolerance) return std::nullopt;
  }
  std::vector<double> x(k);
  for (size_t jj = k; jj-- > 0;) {
    double s = qb[jj];
    for (size_t c = jj + 1; c < k; ++c) s -= r[jj][c] * x[c];
    x[jj] = s / r[jj][jj];
  }
  return x;
}

}  // namespace

const std::array<const char*, kStepCoefficients> kStepCoefficientNames = {
    "step_overhead_s", "prefill_token_s", "prefill_attention_s",
    "decode_step_s",   "decode_row_s",    "decode_kv_token_s"};

StepTerms StepTermsOf(absl::Span<const SimRow> rows) {
  StepTerms t;
  for (const SimRow& row : rows) {
    const double n = static_cast<double>(row.tokens), start = static_cast<double>(row.start);
    if (row.tokens == 1) {
      t.decode_rows += 1;
      t.decode_kv_tokens += start + 1;
    } else if (row.tokens > 1) {
      t.prefill_tokens += n;
      t.prefill_pairs += n * start + n * (n + 1) / 2;
    }
  }
  t.decode = t.decode_rows > 0 ? 1 : 0;
  return t;
}

StepCoefficients TermVector(const StepTerms& t) {
  return {1.0, t.prefill_tokens, t.prefill_pairs, t.decode, t.decode_rows, t.decode_kv_tokens};
}

double PredictStepSeconds(const StepCoefficients& coefficients, const StepTerms& terms) {
  const StepCoefficients x = TermVector(terms);
  double s = 0;
  for (int i = 0; i < kStepCoefficients; ++i) s += coefficients[i] * x[i];
  return s;
}

StepCoefficients CoefficientsOf(const SimCalibration& c) {
  return {c.step_overhead_s, c.prefill_token_s, c.prefill_attention_s,
          c.decode_step_s,   c.decode_row_s,    c.decode_kv_token_s};
}

void SetCoefficients(const StepCoefficients& x, SimCalibration* c) {
  c->step_overhead_s = x[0];
  c->prefill_token_s = x[1];
  c->prefill_attention_s = x[2];
  c->decode_step_s = x[3];
  c->decode_row_s = x[4];
  c->decode_kv_token_s = x[5];
}

absl::StatusOr<std::vector<double>> NonNegativeLeastSquares(
    const std::vector<std::vector<double>>& a, const std::vector<double>& b) {
  if (a.empty() || a.size() != b.size()) {
    return absl::InvalidArgumentError("least squares needs rows and one target per row");
  }
  const size_t n = a[0].size();
  if (n == 0 || n > kMaxColumns) {
    return absl::InvalidArgumentError(
        absl::StrCat("least squares: ", n, " columns (1 to ", kMaxColumns, ")"));
  }
  for (const auto& row : a) {
    if (row.size() != n) return absl::InvalidArgumentError("least squares: ragged rows");
    for (double v : row) {
      if (!std::isfinite(v)) return absl::InvalidArgumentError("least squares: a value not finite");
    }
  }
  for (double v : b) {
    if (!std::isfinite(v)) return absl::InvalidArgumentError("least squares: a target not finite");
  }
  // Unit-norm columns; an all-zero column stays zero (and never enters a support).
  std::vector<double> scale(n, 0);
  for (size_t j = 0; j < n; ++j) {
    double s = 0;
    for (const auto& row : a) s += row[j] * row[j];
    scale[j] = std::sqrt(s);
  }
  std::vector<std::vector<double>> scaled = a;
  for (auto& row : scaled) {
    for (size_t j = 0; j < n; ++j) row[j] = scale[j] > 0 ? row[j] / scale[j] : 0;
  }
  auto residual = [&](const std::vector<double>& x) {
    double s = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      double p = 0;
      for (size_t j = 0; j < n; ++j) p += a[i][j] * x[j];
      s += (p - b[i]) * (p - b[i]);
    }
    return s;
  };
  std::vector<double> best(n, 0);  // the empty support
  double best_residual = residual(best);
  for (uint32_t mask = 1; mask < (uint32_t{1} << n); ++mask) {
    std::vector<int> support;
    bool usable = true;
    for (size_t j = 0; j < n; ++j) {
      if ((mask >> j) & 1) {
        if (scale[j] == 0) usable = false;
        support.push_back(static_cast<int>(j));
      }
    }
    if (!usable) continue;
    std::optional<std::vector<double>> solved = SolveOnSupport(scaled, b, support);
    if (!solved.has_value()) continue;
    std::vector<double> x(n, 0);
    bool feasible = true;
    for (size_t s = 0; s < support.size(); ++s) {
      const double v = (*solved)[s] / scale[support[s]];
      if (!(v >= 0)) feasible = false;
      x[support[s]] = v;
    }
    if (!feasible) continue;
    const double r = residual(x);
    if (r < best_residual) {
      best_residual = r;
      best = std::move(x);
    }
  }
  return best;
}

absl::StatusOr<StepFit> FitStepCoefficients(absl::Span<const StepSample> samples) {
  if (samples.empty()) return absl::InvalidArgumentError("no step samples to fit");
  std::vector<std::vector<double>> a;
  std::vector<double> b;
  for (const StepSample& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds)) {
      return absl::InvalidArgumentError(absl::StrCat("a step sample of ", s.seconds, " s"));
    }
    // Relative error: the row and its target divided by the measured time.
    const StepCoefficients x = TermVector(s.terms);
    std::vector<double> row(kStepCoefficients);
    for (int i = 0; i < kStepCoefficients; ++i) row[i] = x[i] / s.seconds;
    a.push_back(std::move(row));
    b.push_back(1.0);
  }
  std::vector<double> x;
  {
    absl::StatusOr<std::vector<double>> solved = NonNegativeLeastSquares(a, b);
    if (!solved.ok()) return solved.status();
    x = std::move(*solved);
  }
  StepFit fit;
  for (int i = 0; i < kStepCoefficients; ++i) fit.coefficients[i] = x[i];
  double sum = 0;
  for (const StepSample& s : samples) {
    const double e =
        std::abs(PredictStepSeconds(fit.coefficients, s.terms) - s.seconds) / s.seconds;
    sum += e;
    fit.max_abs_relative_error = std::max(fit.max_abs_relative_error, e);
  }
  fit.mean_abs_relative_error = sum / static_cast<double>(samples.size());
  return fit;
}

absl::StatusOr<MovementFit> FitLatencyAndBandwidth(absl::Span<const MovementSample> samples) {
  if (samples.empty()) return absl::InvalidArgumentError("no transfer samples to fit");
  std::vector<std::vector<double>> a;
  std::vector<double> b;
  for (const MovementSample& s : samples) {
    if (!(s.seconds > 0) || !std::isfinite(s.seconds) || !(s.bytes >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a transfer sample of ", s.bytes, " bytes in ", s.seconds, " s"));
    }
    a.push_back({1.0 / s.seconds, s.bytes / s.seconds});
    b.push_back(1.0);
  }
  absl::StatusOr<std::vector<double>> x = NonNegativeLeastSquares(a, b);
  if (!x.ok()) return x.status();
  MovementFit fit;
  fit.latency_s = (*x)[0];
  fit.bytes_per_s = (*x)[1] > 0 ? 1.0 / (*x)[1] : 0;
  double sum = 0;
  for (const MovementSample& s : samples) {
    const double predicted = (*x)[0] + (*x)[1] * s.bytes;
    sum += std::abs(predicted - s.seconds) / s.seconds;
  }
  fit.mean_abs_relative_error = sum / static_cast<double>(samples.size());
  return fit;
}

}  // namespace ferry
