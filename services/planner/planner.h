// The planner: every interval it reads a Snapshot of the pools (pool_snapshot.h) and decides how
// many replicas each pool should have. Prefill grows with the prompt tokens workers must compute
// (and TTFT), decode with concurrent sequences, their KV and the inter-token latency, so each pool
// is sized from its own demand:
//
//   prefill     the computed prompt tokens per second (router counters), forecast a start-up
//               ahead, over the measured prefill speed of one worker at the target utilisation;
//               plus the backlog (queued prompt tokens) to clear within a fraction of the TTFT
//               target; at least what the busy fraction says is in use.
//   decode      the KV and running slots in use (max of the two fractions, summed over workers),
//               scaled by the arrivals' forecast over their current rate (Little's law: the
//               sequences held grow with the arrival rate), at the target utilisation; more when
//               the step time (the inter-token latency) exceeds its target.
//   aggregated  the larger of the two.
//
// The forecast: a linear trend over a recent window, extrapolated to now + the start-up time +
// one interval: a replica asked for now serves only then, and one given back now can be asked for
// again by then, so both directions size for the load then. The load now still counts where it
// must: a backlog or long queue waits add replicas whatever the forecast, and the utilisation
// rule below keeps scale-in from going under the load now. Scale-out is immediate. Scale-in needs
// the lower count to hold for a while (hysteresis: the largest count desired over
// `scale_in_window_s`, each sized for the load plus `scale_in_tolerance`), the pool's cooldown to
// have passed, and the pool's utilisation at or below `scale_in_max_utilisation` (0.8, DeepSeek's
// rule: "scale-in is forbidden whenever quota utilisation is above 0.8"); it removes at most
// `max_scale_in_step` of the pool at once. Replicas asked for but not ready count as present (never
// asked twice), and the time they took to become ready is measured and replaces the configured
// start-up time. Floors, ceilings and warm idle replicas apply last.
//
// Every decision carries its inputs and its reason; `counts()` tallies them. Deterministic: the
// same snapshots give the same decisions. Thread-compatible.

#ifndef FERRY_SERVICES_PLANNER_PLANNER_H_
#define FERRY_SERVICES_PLANNER_PLANNER_H_

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/planner/pool_snapshot.h"

namespace ferry {

struct PoolLimits {
  int64_t min_replicas = 1;
  int64_t max_replicas = 64;
  int64_t warm_idle = 0;  // replicas kept above what the load needs, so a scale-out never waits
};

struct PlannerOptions {
  // The SLO the pools are sized for.
  double ttft_target_s = 2.0;
  double itl_target_s = 0.1;
  // Utilisation a pool is sized to at the forecast load (headroom for bursts).
  double target_utilisation = 0.7;
  // DeepSeek's rule: no scale-in while the pool's utilisation is above this.
  double scale_in_max_utilisation = 0.8;
  double interval_s = 10;  // how often Decide runs (the forecast's step)
  // A new replica's start-up time until it is measured (model load, readiness).
  double startup_s = 60;
  double cooldown_s = 60;           // after a scale event of a pool, no scale-in of it
  double scale_in_window_s = 120;   // scale-in to the largest count desired over this window
  double max_scale_in_step = 0.25;  // fraction of the pool removed at once (at least 1)
  // Scale-in sizes for the load plus this fraction (the HPA's tolerance): a load that hovers
  // at a boundary does not flap across it.
  double scale_in_tolerance = 0.1;
  double forecast_window_s = 300;  // the trend's window
  double rate_half_life_s = 30;    // the rate's smoothing
  // One worker's prefill speed (computed prompt tokens/s) and decode capacity before any is
  // measured (0: assume the pool is right until measured).
  double default_prefill_tokens_per_second = 0;
  std::array<PoolLimits, kPoolRoles> limits;
  // Pools sized; the others are left alone (a pool the snapshot lists no worker of and the
  // actuator has no replicas of is never sized).
  std::array<bool, kPoolRoles> enabled = {true, true, true};

  absl::Status Validate() const;
};

enum class PlanAction { kHold = 0, kScaleOut = 1, kScaleIn = 2 };
const char* PlanActionName(PlanAction action);  // "hold", "scale_out", "scale_in"

// What the planner decided for one pool, and from what.
struct PoolDecision {
  PoolRole pool = PoolRole::kDecode;
  PlanAction action = PlanAction::kHold;
  int64_t current = 0;  // replicas present or starting
  int64_t desired = 0;  // what the actuator should set
  int64_t needed = 0;   // what the load alone needs (before hysteresis, limits, warm idle)
  // A short machine-readable reason ("load", "backlog", "itl", "floor", "ceiling", "cooldown",
  // "utilisation_above_0.8", "hysteresis", "steady", "no_data", ...), and a sentence for the log.
  std::string reason;
  std::string detail;
  // Inputs.
  double utilisation = 0;   // busy (prefill) or KV/running (decode) fraction, mean over ready
  double demand_rate = 0;   // forecast: computed prompt tokens/s (prefill), requests/s (decode)
  double current_rate = 0;  // the same, now (the trend at this moment)
  double per_worker_capacity = 0;  // measured: tokens/s (prefill), sequences or KV share (decode)
  double startup_s = 0;            // the start-up time used
  int64_t ready = 0, starting = 0, draining = 0;
};

struct Plan {
  double time_s = 0;
  std::vector<PoolDecision> pools;  // the enabled pools the snapshot has
};

// Tallies over the planner's life.
struct PlannerCounts {
  int64_t decisions = 0;
  int64_t scale_out = 0, scale_in = 0;  // decisions that changed a pool (events)
  int64_t scale_in_blocked_by_utilisation = 0;
  int64_t scale_in_blocked_by_cooldown = 0;
  std::map<std::string, int64_t> reasons;  // "pool/action/reason" -> decisions
};

class Planner {
 public:
  explicit Planner(PlannerOptions options);

  // Decides from `snapshot` (time_s must not go backwards). A snapshot with no router answering
  // holds every pool.
  Plan Decide(const Snapshot& snapshot);

  // The actuator could not apply `desired` to `pool` (the next Decide sees the pool unchanged
  // and decides again; the cooldown does not start).
  void Rejected(PoolRole pool);

  const PlannerCounts& counts() const { return counts_; }
  const PlannerOptions& options() const { return options_; }
  // The start-up time in use for `pool` (measured, or the option's).
  double startup_s(PoolRole pool) const;

 private:
  // A smoothed rate, its recent samples (for the trend) and its forecast.
  struct Rate {
    double smoothed = 0;
    bool primed = false;
    std::deque<std::pair<double, double>> samples;  // (time, rate over the interval before it)
  };
  struct PoolState {
    std::deque<std::pair<double, int64_t>> needed;  // (time, needed) over scale_in_window_s
    double last_event_s = -1e300;
    double previous_event_s = -1e300;  // restored when the actuator rejects the last event
    // Scale-outs waiting to become ready: (time asked, ready replicas that complete it).
    std::deque<std::pair<double, int64_t>> pending;
    bool pending_added = false;  // by the last Decide (dropped on Rejected)
    double measured_startup_s = -1;
    double prefill_capacity = 0;  // smoothed per-worker prefill speed, tokens/s (0: unknown)
  };

  void Observe(Rate* rate, double now_s, double dt_s, double value);
  // The rate `horizon_s` from now: the trend over the window, never below zero; the smoothed
  // rate when the window has too few samples.
  double Forecast(const Rate& rate, double now_s, double horizon_s) const;
  PoolDecision DecidePool(PoolRole role, const Snapshot& snapshot);
  void Count(const PoolDecision& d);

  PlannerOptions options_;
  PlannerCounts counts_;
  std::array<PoolState, kPoolRoles> pools_;
  bool have_last_ = false;
  Snapshot last_;
  Rate requests_, computed_tokens_;
  // Over the last interval (for the pools' queue waits): mean wait per pool, and waits observed.
  std::array<double, kPoolRoles> queue_wait_mean_s_ = {0, 0, 0};
  std::array<int64_t, kPoolRoles> queue_waits_ = {0, 0, 0};
};

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_PLANNER_H_
