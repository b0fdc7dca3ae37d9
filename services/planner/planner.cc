#include "services/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace {

// A pool needs ceil(x) workers, but a load a hair above an integer (noise) does not add one.
constexpr double kCeilTolerance = 0.05;
// The growth factor the forecast may apply to the load measured now.
constexpr double kMinGrowth = 0.5, kMaxGrowth = 2;

int64_t CeilWorkers(double x) {
  if (!(x > 0)) return 0;
  return static_cast<int64_t>(std::ceil(x - kCeilTolerance));
}

int64_t CounterDelta(int64_t now, int64_t before) { return now >= before ? now - before : 0; }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The pool's role in the dispatcher: what its workers' load means.
bool ComputesPrompts(PoolRole r) { return r != PoolRole::kDecode; }
bool HoldsStreams(PoolRole r) { return r != PoolRole::kPrefill; }

}  // namespace

const char* PlanActionName(PlanAction action) {
  switch (action) {
    case PlanAction::kHold:
      return "hold";
    case PlanAction::kScaleOut:
      return "scale_out";
    case PlanAction::kScaleIn:
      return "scale_in";
  }
  return "unknown";
}

absl::Status PlannerOptions::Validate() const {
  if (!(ttft_target_s > 0) || !(itl_target_s > 0)) {
    return absl::InvalidArgumentError("the TTFT and ITL targets must be > 0");
  }
  if (!(target_utilisation > 0 && target_utilisation <= 1)) {
    return absl::InvalidArgumentError("the target utilisation must be in (0, 1]");
  }
  if (!(scale_in_max_utilisation > 0 && scale_in_max_utilisation <= 1)) {
    return absl::InvalidArgumentError("the scale-in utilisation limit must be in (0, 1]");
  }
  if (!(interval_s > 0)) return absl::InvalidArgumentError("the interval must be > 0");
  if (!(startup_s >= 0) || !(cooldown_s >= 0) || !(scale_in_window_s >= 0) ||
      !(forecast_window_s >= 0) || !(rate_half_life_s > 0)) {
    return absl::InvalidArgumentError(
        "start-up, cooldown and windows must be >= 0, the rate's half-life > 0");
  }
  if (!(scale_in_tolerance >= 0 && scale_in_tolerance <= 1)) {
    return absl::InvalidArgumentError("the scale-in tolerance must be in [0, 1]");
  }
  if (!(max_scale_in_step > 0 && max_scale_in_step <= 1)) {
    return absl::InvalidArgumentError("the scale-in step must be in (0, 1]");
  }
  if (!(default_prefill_tokens_per_second >= 0)) {
    return absl::InvalidArgumentError("the default prefill speed must be >= 0");
  }
  for (int i = 0; i < kPoolRoles; ++i) {
    const PoolLimits& l = limits[i];
    if (l.min_replicas < 0 || l.max_replicas < l.min_replicas || l.warm_idle < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(PoolRoleName(static_cast<PoolRole>(i)),
                       ": replicas need 0 <= min <= max and warm idle >= 0 (min ", l.min_replicas,
                       ", max ", l.max_replicas, ", warm idle ", l.warm_idle, ")"));
    }
  }
  return absl::OkStatus();
}

Planner::Planner(PlannerOptions options) : options_(std::move(options)) {}

double Planner::startup_s(PoolRole pool) const {
  const PoolState& st = pools_[static_cast<int>(pool)];
  return st.measured_startup_s >= 0 ? st.measured_startup_s : options_.startup_s;
}

void Planner::Observe(Rate* rate, double now_s, double dt_s, double value) {
  if (!rate->primed) {
    rate->smoothed = value;
    rate->primed = true;
  } else {
    const double alpha = 1 - std::exp(-dt_s * std::log(2.0) / options_.rate_half_life_s);
    rate->smoothed += alpha * (value - rate->smoothed);
  }
  rate->samples.emplace_back(now_s, value);
  while (!rate->samples.empty() &&
         rate->samples.front().first < now_s - options_.forecast_window_s) {
    rate->samples.pop_front();
  }
}

double Planner::Forecast(const Rate& rate, double now_s, double horizon_s) const {
  const size_t n = rate.samples.size();
  if (n < 3) return rate.smoothed;
  double mean_t = 0, mean_v = 0;
  for (const auto& [t, v] : rate.samples) {
    mean_t += t;
    mean_v += v;
  }
  mean_t /= static_cast<double>(n);
  mean_v /= static_cast<double>(n);
  double stt = 0, stv = 0;
  for (const auto& [t, v] : rate.samples) {
    stt += (t - mean_t) * (t - mean_t);
    stv += (t - mean_t) * (v - mean_v);
  }
  const double slope = stt > 0 ? stv / stt : 0;
  return std::max(0.0, mean_v + slope * (now_s + horizon_s - mean_t));
}

Plan Planner::Decide(const Snapshot& snapshot) {
  Plan plan;
  plan.time_s = snapshot.time_s;
  const double now = snapshot.time_s;
  const double dt = have_last_ ? now - last_.time_s : 0;
  if (snapshot.routers <= 0) {
    // Nothing to decide from: hold, and keep the last counters to difference against.
    for (int i = 0; i < kPoolRoles; ++i) {
      const PoolRole role = static_cast<PoolRole>(i);
      const PoolSample& pool = snapshot.pool(role);
      if (!options_.enabled[i] || (pool.workers.empty() && pool.spec_replicas <= 0)) continue;
      PoolDecision d;
      d.pool = role;
      d.current = d.desired = std::max<int64_t>(pool.spec_replicas, 0);
      d.reason = "no_router";
      d.detail = "no router answered: holding";
      Count(d);
      plan.pools.push_back(std::move(d));
    }
    return plan;
  }
  queue_wait_mean_s_ = {0, 0, 0};
  queue_waits_ = {0, 0, 0};
  if (have_last_ && dt > 0) {
    const RouterCounters& c = snapshot.counters;
    const RouterCounters& b = last_.counters;
    Observe(&requests_, now, dt, static_cast<double>(CounterDelta(c.requests, b.requests)) / dt);
    Observe(
        &computed_tokens_, now, dt,
        static_cast<double>(CounterDelta(c.computed_prompt_tokens, b.computed_prompt_tokens)) / dt);
    for (int i = 0; i < kPoolRoles; ++i) {
      const PoolSample& p = snapshot.pools[i];
      const PoolSample& q = last_.pools[i];
      const int64_t n = CounterDelta(p.queue_wait_count, q.queue_wait_count);
      if (n <= 0) continue;
      queue_waits_[i] = n;
      queue_wait_mean_s_[i] = std::max(0.0, p.queue_wait_seconds_sum - q.queue_wait_seconds_sum) /
                              static_cast<double>(n);
    }
  }
  for (int i = 0; i < kPoolRoles; ++i) {
    const PoolRole role = static_cast<PoolRole>(i);
    const PoolSample& pool = snapshot.pool(role);
    pools_[i].pending_added = false;
    if (!options_.enabled[i] || (pool.workers.empty() && pool.spec_replicas <= 0)) continue;
    PoolDecision d = DecidePool(role, snapshot);
    Count(d);
    plan.pools.push_back(std::move(d));
  }
  last_ = snapshot;
  have_last_ = true;
  return plan;
}

PoolDecision Planner::DecidePool(PoolRole role, const Snapshot& snapshot) {
  const int r = static_cast<int>(role);
  const PoolSample& pool = snapshot.pool(role);
  PoolState& st = pools_[r];
  const PoolLimits& limits = options_.limits[r];
  const double now = snapshot.time_s;
  PoolDecision d;
  d.pool = role;

  // What the pool has.
  int64_t unready = 0;
  double busy_sum = 0, load_sum = 0, step_ms_sum = 0;
  int64_t stepping = 0, backlog_tokens = 0;
  std::vector<double> prefill_speeds, kv_tokens;
  for (const WorkerSample& w : pool.workers) {
    const double load = std::max(KvUsedFraction(w), RunningFraction(w));
    if (w.draining) {
      ++d.draining;
      load_sum += load;  // its streams need a home when it goes
      continue;
    }
    if (!w.ready) {
      ++unready;
      continue;
    }
    ++d.ready;
    busy_sum += std::clamp(w.busy_fraction, 0.0, 1.0);
    load_sum += load;
    backlog_tokens += std::max<int64_t>(0, w.queued_tokens);
    if (w.prefill_tokens_per_second > 0) prefill_speeds.push_back(w.prefill_tokens_per_second);
    if (w.total_kv_blocks > 0 && w.block_tokens > 0) {
      kv_tokens.push_back(static_cast<double>(w.total_kv_blocks * w.block_tokens));
    }
    if (w.running_requests > 0 && w.step_time_ms > 0) {
      step_ms_sum += w.step_time_ms;
      ++stepping;
    }
  }
  d.current = pool.spec_replicas >= 0 ? pool.spec_replicas : d.ready + unready + pool.starting;
  d.starting = std::max<int64_t>(pool.starting, d.current - d.ready);

  // Start-up: a scale-out completes when the pool has as many ready replicas as it asked for.
  const double startup_limit = 10 * startup_s(role) + options_.interval_s;
  while (!st.pending.empty()) {
    const auto [asked, want] = st.pending.front();
    if (d.ready >= want) {
      const double took = now - asked;
      st.measured_startup_s =
          st.measured_startup_s < 0 ? took : 0.5 * st.measured_startup_s + 0.5 * took;
    } else if (now - asked <= startup_limit) {
      break;
    }
    st.pending.pop_front();
  }
  d.startup_s = startup_s(role);
  const double horizon = d.startup_s + options_.interval_s;

  // The load: now and a start-up ahead. (The trend's value now, not the smoothed rate, is what
  // the load measured now goes with: the smoothed rate lags a ramp and would inflate growth.)
  const double req_now = Forecast(requests_, now, 0);
  const double req_ahead = Forecast(requests_, now, horizon);
  const double tok_now = Forecast(computed_tokens_, now, 0);
  const double tok_ahead = Forecast(computed_tokens_, now, horizon);
  const double u = options_.target_utilisation;
  auto growth = [](double ahead, double now_rate) {
    return now_rate > 0 ? std::clamp(ahead / now_rate, kMinGrowth, kMaxGrowth) : 1.0;
  };
  // The router's queue, given to the pools whose waits it saw (to every pool when it saw none:
  // a request waits for a decode worker's KV room and a prefill worker).
  const bool queue_here =
      queue_waits_[r] > 0 || (queue_waits_[0] == 0 && queue_waits_[1] == 0 && queue_waits_[2] == 0);
  const int64_t router_queued_tokens =
      queue_here ? std::max<int64_t>(0, snapshot.queued_tokens) : 0;
  double capacity = 0;
  if (ComputesPrompts(role)) {
    if (!prefill_speeds.empty()) {
      const double m = Median(prefill_speeds);
      st.prefill_capacity = st.prefill_capacity > 0 ? 0.7 * st.prefill_capacity + 0.3 * m : m;
    }
    capacity =
        st.prefill_capacity > 0 ? st.prefill_capacity : options_.default_prefill_tokens_per_second;
  }
  const double kv_per_worker = Median(kv_tokens);

  // Workers the load needs, and the reason (the term that needs the most): sized for the load a
  // start-up ahead, since a replica asked for now serves only then, and one given back now can
  // be asked for again by then. The load now is the utilisation rule's (scale-in) and the
  // backlog's and queue waits' (scale-out: more now, whatever the forecast).
  struct Need {
    double workers = 0;
    std::string reason = "idle";
    void Consider(double w, const char* why) {
      if (w > workers + 1e-9) {
        workers = w;
        reason = why;
      }
    }
  };
  auto needs = [&](bool out) {
    Need n;
    const double req_growth = growth(req_ahead, req_now);
    const double tok_growth = growth(tok_ahead, tok_now);
    const double tok_demand = tok_now * tok_growth;
    if (ComputesPrompts(role)) {
      n.Consider(busy_sum * tok_growth / u, "busy");
      if (capacity > 0) {
        n.Consider(tok_demand / (capacity * u), "load");
        // Arrivals plus the backlog cleared within half the TTFT target, at full speed.
        const double backlog = static_cast<double>(backlog_tokens + router_queued_tokens);
        n.Consider((tok_demand + backlog / (0.5 * options_.ttft_target_s)) / capacity, "backlog");
      }
    }
    if (HoldsStreams(role)) {
      n.Consider(load_sum * req_growth / u, "kv");
      // Held KV saturates at the pool's size; the requests queued for room are the load beyond.
      // Counted as if they held their prompt at once (an upper bound: each holds it only while
      // it decodes), so at most one more pool's worth at a time.
      if (kv_per_worker > 0 && router_queued_tokens > 0) {
        const double queued = std::min(static_cast<double>(router_queued_tokens) / kv_per_worker,
                                       static_cast<double>(std::max<int64_t>(1, d.ready)));
        n.Consider((load_sum + queued) * req_growth / u, "queue");
      }
    }
    // Signs the load model missed, each worth one more replica, and only while none is starting
    // (the ones starting may be what the signs wait for):
    if (!out || d.starting > 0) return n;
    // the inter-token latency: a decode step slower than the target (one at a time: a step has
    // a floor no worker count lowers);
    if (HoldsStreams(role) && stepping > 0 &&
        step_ms_sum / static_cast<double>(stepping) > options_.itl_target_s * 1e3) {
      n.Consider(static_cast<double>(d.current + 1), "itl");
    }
    // requests that waited for this pool longer than a quarter of the TTFT target.
    if (queue_waits_[r] > 0 && queue_wait_mean_s_[r] > 0.25 * options_.ttft_target_s) {
      n.Consider(static_cast<double>(d.current + 1), "queue_wait");
    }
    return n;
  };
  const Need out = needs(true);
  const Need in = needs(false);
  const double needed = out.workers;
  std::string reason = out.reason;

  if (ComputesPrompts(role)) {
    d.per_worker_capacity = capacity;
    d.demand_rate = tok_ahead;
    d.current_rate = tok_now;
  } else {
    d.per_worker_capacity = kv_per_worker;
    d.demand_rate = req_ahead;
    d.current_rate = req_now;
  }
  // Utilisation, over the ready workers: the busy fraction for a pool that computes prompts, the
  // KV or running slots held for one that holds streams (the larger for an aggregated pool).
  double utilisation = 0;
  if (d.ready > 0) {
    if (ComputesPrompts(role)) utilisation = busy_sum / static_cast<double>(d.ready);
    if (HoldsStreams(role)) {
      double held = 0;
      for (const WorkerSample& w : pool.workers) {
        if (w.ready && !w.draining) held += std::max(KvUsedFraction(w), RunningFraction(w));
      }
      utilisation = std::max(utilisation, held / static_cast<double>(d.ready));
    }
  }
  d.utilisation = utilisation;
  d.needed = CeilWorkers(needed);

  int64_t desired = d.needed + limits.warm_idle;
  if (limits.warm_idle > 0 && desired > d.needed && reason == "idle") reason = "warm_idle";
  if (desired < limits.min_replicas) {
    desired = limits.min_replicas;
    reason = "floor";
  }
  if (desired > limits.max_replicas) {
    desired = limits.max_replicas;
    reason = "ceiling";
  }
  // What scale-in may go down to: the load a start-up ahead plus the tolerance, within limits.
  const int64_t keep =
      std::clamp(CeilWorkers(in.workers * (1 + options_.scale_in_tolerance)) + limits.warm_idle,
                 limits.min_replicas, limits.max_replicas);
  st.needed.emplace_back(now, keep);
  while (!st.needed.empty() && st.needed.front().first < now - options_.scale_in_window_s) {
    st.needed.pop_front();
  }

  d.desired = d.current;
  const double limit = options_.scale_in_max_utilisation;
  if (desired > d.current) {
    d.action = PlanAction::kScaleOut;
    d.desired = desired;
    d.reason = reason;
    st.previous_event_s = st.last_event_s;
    st.last_event_s = now;
    st.pending.emplace_back(now, desired);
    st.pending_added = true;
  } else {
    int64_t target = keep;
    for (const auto& [t, n] : st.needed) target = std::max(target, n);
    if (target >= d.current) {
      d.reason = keep >= d.current ? "steady" : "hysteresis";
    } else if (utilisation > limit) {
      d.reason = absl::StrFormat("utilisation_above_%g", limit);
      ++counts_.scale_in_blocked_by_utilisation;
    } else if (now - st.last_event_s < options_.cooldown_s) {
      d.reason = "cooldown";
      ++counts_.scale_in_blocked_by_cooldown;
    } else if (d.starting > 0) {
      d.reason = "starting";
    } else {
      int64_t remove = std::min(
          d.current - target,
          std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(d.current) *
                                                               options_.max_scale_in_step))));
      // The rule holds after the scale-in too: the load left must fit under the limit.
      while (remove > 0 && (d.ready - remove <= 0 || utilisation * static_cast<double>(d.ready) /
                                                             static_cast<double>(d.ready - remove) >
                                                         limit)) {
        --remove;
      }
      if (remove == 0) {
        d.reason = absl::StrFormat("utilisation_after_above_%g", limit);
      } else {
        d.action = PlanAction::kScaleIn;
        d.desired = d.current - remove;
        d.reason =
            keep == limits.min_replicas && in.workers < limits.min_replicas ? "floor" : in.reason;
        st.previous_event_s = st.last_event_s;
        st.last_event_s = now;
        st.pending.clear();
      }
    }
  }
  d.detail = absl::StrFormat(
      "%s %s %d -> %d (needs %d, %s): utilisation %.2f, ready %d, starting %d, draining %d, "
      "demand %.1f/s (now %.1f/s), capacity %.1f, start-up %.0f s",
      PoolRoleName(role), PlanActionName(d.action), d.current, d.desired, d.needed, reason,
      d.utilisation, d.ready, d.starting, d.draining, d.demand_rate, d.current_rate,
      d.per_worker_capacity, d.startup_s);
  return d;
}

void Planner::Count(const PoolDecision& d) {
  ++counts_.decisions;
  if (d.action == PlanAction::kScaleOut) ++counts_.scale_out;
  if (d.action == PlanAction::kScaleIn) ++counts_.scale_in;
  ++counts_
        .reasons[absl::StrCat(PoolRoleName(d.pool), "/", PlanActionName(d.action), "/", d.reason)];
}

void Planner::Rejected(PoolRole pool) {
  PoolState& st = pools_[static_cast<int>(pool)];
  st.last_event_s = st.previous_event_s;
  if (st.pending_added && !st.pending.empty()) st.pending.pop_back();
  st.pending_added = false;
}

}  // namespace ferry
