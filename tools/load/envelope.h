// A load envelope: a day's shape laid over a workload (a trace or a synthetic one), for the load
// tool's open loop and the discrete-event simulator, so that a planner meets load that rises and
// falls. The base workload is looped as often as the envelope needs and its arrivals are warped
// in time so that the arrival rate follows the shape:
//
//   sine   rate(t) = mean - amplitude x cos(2 pi t / period): the trough (peak / ratio) at t = 0,
//          the peak at period / 2, mean / peak = (1 + 1 / ratio) / 2 (0.625 for 4:1).
//
// Units: the rate counts requests, or sessions for a sessions workload (a session's later turns
// follow it: their arrival_s stays 0, and the tools send them after the previous turn's end plus
// think time). The base's arrivals give the order and the jitter of the units: a trace's own
// times (each loop follows the previous one a mean gap later), for a synthetic workload a Poisson
// process (seeded) or constant gaps. Time-warping maps the base's expected count to the
// envelope's: a unit at base time u arrives at t with Count(t) = u x base rate, so a Poisson base
// becomes a Poisson process of the envelope's rate and a trace keeps its bursts, scaled.
//
// Loops: loop 0 is the base; in loop k >= 1 every prompt token is shifted in the token space by an
// amount keyed on (k, its position), so that equal prefixes within a loop stay equal and no two
// loops share a block (a loop creates no cache hit the base lacks). Request ids are renumbered in
// arrival order (0, 1, ...), sessions and groups get ids of their own per loop. Units arriving
// after the envelope's duration are left out.
//
// Pure functions over values; thread-compatible.

#ifndef FERRY_TOOLS_LOAD_ENVELOPE_H_
#define FERRY_TOOLS_LOAD_ENVELOPE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ferry {

// workload.h (which holds an EnvelopeSpec in its options).
struct Workload;
struct TokenSpace;

struct EnvelopeSpec {
  std::string shape = "none";  // "none" or "sine"
  double period_s = 3600;
  double ratio = 4;       // peak rate over trough rate, >= 1
  double peak = 0;        // units (requests, or sessions) per second at the peak; > 0 for a shape
  double duration_s = 0;  // 0: one period
  // The base's arrivals when it has no times of its own (not a trace): "poisson" or "constant".
  std::string arrivals = "poisson";
  uint64_t seed = 1;

  bool active() const { return shape != "none"; }
  double duration() const { return duration_s > 0 ? duration_s : period_s; }
  absl::Status Validate() const;
};

// Units per second at `t` and units expected in [0, t] (shape "none": 0).
double EnvelopeRate(const EnvelopeSpec& spec, double t);
double EnvelopeCount(const EnvelopeSpec& spec, double t);

// Replaces the base `workload` with it looped and warped to `spec` (see above; shape "none"
// leaves it); `space` is the ids' space the loops' shifts stay in. InvalidArgument for a bad spec
// or an empty base (the workload is left then).
absl::Status ApplyEnvelope(const EnvelopeSpec& spec, const TokenSpace& space, Workload* workload);

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_ENVELOPE_H_
