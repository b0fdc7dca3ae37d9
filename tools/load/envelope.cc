#include "tools/load/envelope.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/load/workload.h"

namespace ferry {
namespace {

constexpr double kPi = 3.14159265358979323846;

uint64_t Mix(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The i-th uniform draw in [0, 1) of `seed`'s stream.
double Uniform(uint64_t seed, uint64_t i) {
  return static_cast<double>(Mix(Mix(seed ^ 0x656e76656c6f7065ull) ^ i) >> 11) * 0x1.0p-53;
}

struct Sine {
  double mean, amplitude, period;
};

Sine SineOf(const EnvelopeSpec& spec) {
  const double trough = spec.peak / spec.ratio;
  return Sine{(spec.peak + trough) / 2, (spec.peak - trough) / 2, spec.period_s};
}

// The t with EnvelopeCount(t) = count (the count is increasing: the rate is > 0).
double InverseCount(const EnvelopeSpec& spec, double count) {
  const double trough = spec.peak / spec.ratio;
  double lo = count / spec.peak, hi = count / trough;
  for (int i = 0; i < 100 && hi - lo > 1e-12 * std::max(1.0, hi); ++i) {
    const double mid = (lo + hi) / 2;
    if (EnvelopeCount(spec, mid) < count) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return (lo + hi) / 2;
}

// Shifts every id of `prompt` in `space` by an amount keyed on (loop, position).
void Salt(uint64_t loop, const TokenSpace& space, std::vector<TokenId>* prompt) {
  const int64_t range = std::max<int64_t>(1, space.token_range);
  for (size_t j = 0; j < prompt->size(); ++j) {
    const int64_t offset = static_cast<int64_t>((*prompt)[j]) - space.token_base;
    if (offset < 0 || offset >= range) continue;  // not of the space: left alone
    const int64_t shift = static_cast<int64_t>(Mix(Mix(loop) ^ j) % static_cast<uint64_t>(range));
    (*prompt)[j] = space.token_base + static_cast<TokenId>((offset + shift) % range);
  }
}

}  // namespace

absl::Status EnvelopeSpec::Validate() const {
  if (shape == "none") return absl::OkStatus();
  if (shape != "sine") {
    return absl::InvalidArgumentError(absl::StrCat("unknown envelope '", shape, "': none or sine"));
  }
  if (!(period_s > 0)) return absl::InvalidArgumentError("--envelope_period must be > 0");
  if (!(ratio >= 1)) return absl::InvalidArgumentError("--envelope_ratio must be >= 1");
  if (!(peak > 0)) return absl::InvalidArgumentError("--envelope needs --envelope_peak > 0");
  if (!(duration_s >= 0)) return absl::InvalidArgumentError("--envelope_duration must be >= 0");
  if (arrivals != "poisson" && arrivals != "constant") {
    return absl::InvalidArgumentError("--arrivals must be poisson or constant");
  }
  return absl::OkStatus();
}

double EnvelopeRate(const EnvelopeSpec& spec, double t) {
  if (spec.shape != "sine") return 0;
  const Sine s = SineOf(spec);
  return s.mean - s.amplitude * std::cos(2 * kPi * t / s.period);
}

double EnvelopeCount(const EnvelopeSpec& spec, double t) {
  if (spec.shape != "sine") return 0;
  const Sine s = SineOf(spec);
  return s.mean * t - s.amplitude * s.period / (2 * kPi) * std::sin(2 * kPi * t / s.period);
}

absl::Status ApplyEnvelope(const EnvelopeSpec& spec, const TokenSpace& space, Workload* workload) {
  if (absl::Status valid = spec.Validate(); !valid.ok()) return valid;
  if (!spec.active()) return absl::OkStatus();
  const Workload& base = *workload;
  if (base.requests.empty()) return absl::InvalidArgumentError("the envelope needs requests");
  // The base's units in order: a session's turns, or one request.
  std::vector<std::vector<size_t>> units;
  std::map<int64_t, size_t> session_unit;
  int64_t groups = 0;
  for (size_t i = 0; i < base.requests.size(); ++i) {
    const LoadRequest& r = base.requests[i];
    groups = std::max(groups, r.group + 1);
    if (r.session < 0) {
      units.push_back({i});
      continue;
    }
    auto [it, added] = session_unit.emplace(r.session, units.size());
    if (added) units.emplace_back();
    units[it->second].push_back(i);
  }
  const size_t n = units.size();
  // The base's expected count at each unit: a trace's times x its rate (loop k a period of the
  // base later), or a Poisson / constant process of rate 1.
  double first = 0, span = 0;
  if (base.kind == "trace") {
    first = base.requests[units.front().front()].arrival_s;
    const double last = base.requests[units.back().front()].arrival_s;
    if (n > 1 && last > first) span = (last - first) * static_cast<double>(n) / (n - 1.0);
  }
  const bool timed = span > 0;
  const double base_rate = timed ? static_cast<double>(n) / span : 1;
  const double total = EnvelopeCount(spec, spec.duration());
  Workload out;
  out.kind = base.kind;
  out.think_s = base.think_s;
  out.dropped_requests = base.dropped_requests;
  out.cut_tokens = base.cut_tokens;
  double count = 0;
  uint64_t draw = 0;
  int64_t sessions = 0, loops = 0, units_out = 0;
  for (uint64_t loop = 0;; ++loop) {
    bool over = false;
    for (size_t u = 0; u < n && !over; ++u) {
      if (timed) {
        const double at = base.requests[units[u].front()].arrival_s - first;
        count = base_rate * (static_cast<double>(loop) * span + std::max(0.0, at));
      } else if (loop > 0 || u > 0) {
        count += spec.arrivals == "constant" ? 1.0 : -std::log1p(-Uniform(spec.seed, draw++));
      }
      if (count > total) {
        over = true;
        break;
      }
      const double t = count > 0 ? InverseCount(spec, count) : 0;
      const int64_t session = base.requests[units[u].front()].session >= 0 ? sessions++ : -1;
      for (size_t turn = 0; turn < units[u].size(); ++turn) {
        LoadRequest r = base.requests[units[u][turn]];
        r.id = static_cast<int64_t>(out.requests.size());
        r.arrival_s = turn == 0 ? t : 0;
        r.session = session;
        if (r.group >= 0) r.group += static_cast<int64_t>(loop) * groups;
        if (loop > 0) Salt(loop, space, &r.prompt);
        out.requests.push_back(std::move(r));
      }
      ++units_out;
      loops = static_cast<int64_t>(loop) + 1;
    }
    if (over) break;
  }
  out.note = absl::StrFormat(
      "%s; envelope %s: period %.6g s, %.3g:1, peak %.6g %s/s, %.6g s: %d %s from %d loops of "
      "the base's %d",
      base.note, spec.shape, spec.period_s, spec.ratio, spec.peak,
      session_unit.empty() ? "requests" : "sessions", spec.duration(), units_out,
      session_unit.empty() ? "requests" : "sessions", loops, n);
  *workload = std::move(out);
  return absl::OkStatus();
}

}  // namespace ferry
