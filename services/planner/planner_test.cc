// The planner on metric series: snapshots built step by step from a pool model (each worker's
// load from the offered rate), fed to Decide as the service would every interval.

#include "services/planner/planner.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr double kInterval = 10;
constexpr int64_t kBlockTokens = 64;
constexpr int64_t kKvBlocks = 1000;

// A P/D deployment under a load: `rate` requests/s, each `prompt` computed tokens and holding a
// decode worker's KV for `hold_s` seconds at `tokens_held` positions. Workers: prefill compute
// `prefill_speed` tokens/s; decode hold kKvBlocks blocks. Counters accumulate as a router's do.
struct PoolModel {
  double prompt = 2000, prefill_speed = 10000, hold_s = 5, tokens_held = 4000;
  int64_t prefill_spec = 2, decode_spec = 2;
  int64_t prefill_ready = 2, decode_ready = 2;
  double time = 0;
  double startup = 0;  // a replica asked for is ready this long after (seen by the next Step)
  std::vector<std::pair<double, int64_t>> prefill_starts, decode_starts;  // (ready at, spec)
  RouterCounters counters;
  double request_carry = 0, token_carry = 0;

  Snapshot Step(double rate) {
    time += kInterval;
    for (auto* starts : {&prefill_starts, &decode_starts}) {
      int64_t& ready = starts == &prefill_starts ? prefill_ready : decode_ready;
      const int64_t spec = starts == &prefill_starts ? prefill_spec : decode_spec;
      for (const auto& [at, n] : *starts) {
        if (at <= time) ready = std::min(spec, std::max(ready, n));
      }
    }
    request_carry += rate * kInterval;
    const auto requests = static_cast<int64_t>(request_carry);
    request_carry -= static_cast<double>(requests);
    counters.requests += requests;
    token_carry += rate * kInterval * prompt;
    const auto tokens = static_cast<int64_t>(token_carry);
    token_carry -= static_cast<double>(tokens);
    counters.computed_prompt_tokens += tokens;
    counters.prompt_tokens += tokens;
    Snapshot s;
    s.time_s = time;
    s.routers = 1;
    s.counters = counters;
    PoolSample& p = s.pool(PoolRole::kPrefill);
    p.spec_replicas = prefill_spec;
    p.starting = prefill_spec - prefill_ready;
    const double prefill_busy =
        prefill_ready > 0 ? rate * prompt / (prefill_speed * static_cast<double>(prefill_ready))
                          : 0;
    for (int64_t i = 0; i < prefill_ready; ++i) {
      WorkerSample w;
      w.id = "p" + std::to_string(i);
      w.ready = true;
      w.busy_fraction = std::min(1.0, prefill_busy);
      w.prefill_tokens_per_second = prefill_busy > 0 ? prefill_speed : 0;
      if (prefill_busy > 1) {
        w.queued_tokens = static_cast<int64_t>((prefill_busy - 1) * prefill_speed * kInterval);
      }
      p.workers.push_back(w);
    }
    PoolSample& d = s.pool(PoolRole::kDecode);
    d.spec_replicas = decode_spec;
    d.starting = decode_spec - decode_ready;
    // Little's law: sequences held = rate x hold time, spread evenly.
    const double held_tokens = rate * hold_s * tokens_held;
    for (int64_t i = 0; i < decode_ready; ++i) {
      WorkerSample w;
      w.id = "d" + std::to_string(i);
      w.ready = true;
      w.block_tokens = kBlockTokens;
      w.total_kv_blocks = kKvBlocks;
      const double mine = held_tokens / static_cast<double>(decode_ready);
      const auto blocks = std::min<int64_t>(kKvBlocks, static_cast<int64_t>(mine / kBlockTokens));
      w.running_tokens = blocks * kBlockTokens;
      w.free_kv_blocks = kKvBlocks - blocks;
      w.running_requests = static_cast<int64_t>(rate * hold_s / static_cast<double>(decode_ready));
      w.max_running_requests = 256;
      w.step_time_ms = 20;
      d.workers.push_back(w);
    }
    return s;
  }

  // Applies the plan as an actuator: new replicas are ready `startup` later, removed ones go
  // at once.
  void Apply(const Plan& plan) {
    for (const PoolDecision& d : plan.pools) {
      if (d.pool == PoolRole::kAggregated) continue;
      const bool prefill = d.pool == PoolRole::kPrefill;
      int64_t& spec = prefill ? prefill_spec : decode_spec;
      int64_t& ready = prefill ? prefill_ready : decode_ready;
      auto& starts = prefill ? prefill_starts : decode_starts;
      if (d.desired > spec) {
        if (startup <= 0) {
          ready = d.desired;
        } else {
          starts.emplace_back(time + startup, d.desired);
        }
      } else {
        ready = std::min(ready, d.desired);
      }
      spec = d.desired;
    }
  }
};

const PoolDecision* Find(const Plan& plan, PoolRole role) {
  for (const PoolDecision& d : plan.pools) {
    if (d.pool == role) return &d;
  }
  return nullptr;
}

PlannerOptions Options() {
  PlannerOptions o;
  o.interval_s = kInterval;
  o.startup_s = 0;
  o.cooldown_s = 60;
  o.scale_in_window_s = 60;
  return o;
}

TEST(PlannerTest, ValidateRejectsBadOptions) {
  EXPECT_TRUE(Options().Validate().ok());
  PlannerOptions o = Options();
  o.target_utilisation = 0;
  EXPECT_FALSE(o.Validate().ok());
  o = Options();
  o.scale_in_max_utilisation = 1.5;
  EXPECT_FALSE(o.Validate().ok());
  o = Options();
  o.limits[1].min_replicas = 5;
  o.limits[1].max_replicas = 2;
  EXPECT_FALSE(o.Validate().ok());
  o = Options();
  o.max_scale_in_step = 0;
  EXPECT_FALSE(o.Validate().ok());
}

TEST(PlannerTest, SizesEachPoolFromItsOwnDemand) {
  // 10 req/s x 2000 tokens = 20k tokens/s over 10k tokens/s workers at 0.7: 3 prefill.
  // Decode: 10 x 5 s x 4000 tokens = 200k tokens held over 64k per worker: 3.1 at full, 4.5 at
  // 0.7: 5 decode.
  Planner planner(Options());
  PoolModel m;
  Plan plan;
  for (int i = 0; i < 30; ++i) {
    plan = planner.Decide(m.Step(10));
    m.Apply(plan);
  }
  ASSERT_NE(Find(plan, PoolRole::kPrefill), nullptr);
  EXPECT_EQ(m.prefill_spec, 3);
  EXPECT_EQ(m.decode_spec, 5);
  EXPECT_NEAR(Find(plan, PoolRole::kPrefill)->per_worker_capacity, 10000, 1);
  EXPECT_EQ(Find(plan, PoolRole::kDecode)->reason, "steady");
}

TEST(PlannerTest, ScalesOutUnderASurgeAheadOfTheLoad) {
  PlannerOptions o = Options();
  o.startup_s = 60;  // a replica asked for now serves 70 s from now
  Planner planner(o);
  PoolModel m;
  m.startup = 60;
  for (int i = 0; i < 12; ++i) m.Apply(planner.Decide(m.Step(4)));
  const int64_t before = m.decode_spec;
  // The rate ramps 4 -> 12 req/s over 2 minutes.
  int64_t asked_at_ramp_end = 0;
  for (int i = 1; i <= 12; ++i) {
    m.Apply(planner.Decide(m.Step(4 + 8.0 * i / 12)));
    if (i == 12) asked_at_ramp_end = m.decode_spec;
  }
  EXPECT_GT(asked_at_ramp_end, before);
  // Ahead of the load: more than the load at the ramp's end needs now at the target (12 req/s:
  // 240k tokens over 64k per worker at 0.7 = 5.4 -> 6), since the trend continues a start-up on.
  EXPECT_GE(asked_at_ramp_end, 6);
  EXPECT_GT(planner.counts().scale_out, 0);
  // The same ramp without a start-up time asks for no more than the load needs then.
  PlannerOptions z = Options();
  Planner instant(z);
  PoolModel n;
  for (int i = 0; i < 12; ++i) n.Apply(instant.Decide(n.Step(4)));
  for (int i = 1; i <= 12; ++i) n.Apply(instant.Decide(n.Step(4 + 8.0 * i / 12)));
  EXPECT_LT(n.decode_spec, asked_at_ramp_end);
}

TEST(PlannerTest, NeverScalesInAboveTheUtilisationLimit) {
  // The decode pool is 85% full while the rate halves: the forecast says fewer are needed, but
  // the pool is above 0.8.
  PlannerOptions o = Options();
  o.cooldown_s = 0;
  o.scale_in_window_s = 0;
  o.startup_s = 120;  // the forecast two minutes on is far lower
  Planner planner(o);
  Snapshot s;
  s.routers = 1;
  PoolSample& d = s.pool(PoolRole::kDecode);
  d.spec_replicas = 4;
  for (int i = 0; i < 4; ++i) {
    WorkerSample w;
    w.id = "d" + std::to_string(i);
    w.ready = true;
    w.block_tokens = kBlockTokens;
    w.total_kv_blocks = kKvBlocks;
    w.free_kv_blocks = 150;
    w.running_tokens = 850 * kBlockTokens;
    d.workers.push_back(w);
  }
  int64_t rate_requests = 0;
  for (int i = 0; i < 20; ++i) {
    s.time_s = kInterval * (i + 1);
    rate_requests += 200 - 8 * i;  // falling arrivals
    s.counters.requests = rate_requests;
    const Plan plan = planner.Decide(s);
    const PoolDecision* dd = Find(plan, PoolRole::kDecode);
    ASSERT_NE(dd, nullptr);
    EXPECT_NE(dd->action, PlanAction::kScaleIn) << dd->detail;
    EXPECT_NEAR(dd->utilisation, 0.85, 1e-9);
  }
  EXPECT_GT(planner.counts().scale_in_blocked_by_utilisation, 0);
  EXPECT_EQ(planner.counts().scale_in, 0);
  // At 0.75 the same pool may scale in, but only as far as keeps it at or below 0.8.
  for (WorkerSample& w : d.workers) {
    w.free_kv_blocks = 250;
    w.running_tokens = 750 * kBlockTokens;
  }
  s.time_s += kInterval;
  s.counters.requests += 10;
  const Plan plan = planner.Decide(s);
  const PoolDecision* dd = Find(plan, PoolRole::kDecode);
  ASSERT_NE(dd, nullptr);
  // 4 x 0.75 = 3 workers' load: 3 workers would be at 1.0, so none may go.
  EXPECT_EQ(dd->action, PlanAction::kHold) << dd->detail;
  EXPECT_EQ(dd->reason, "utilisation_after_above_0.8");
}

TEST(PlannerTest, DoesNotFlapUnderNoise) {
  // A steady load near a boundary, +-15% noise per interval, for an hour.
  PlannerOptions o = Options();
  o.startup_s = 30;
  o.scale_in_window_s = 120;
  Planner planner(o);
  PoolModel m;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.85, 1.15);
  for (int i = 0; i < 30; ++i) m.Apply(planner.Decide(m.Step(8)));
  const int64_t events_before = planner.counts().scale_out + planner.counts().scale_in;
  for (int i = 0; i < 360; ++i) m.Apply(planner.Decide(m.Step(8 * noise(rng))));
  const int64_t events = planner.counts().scale_out + planner.counts().scale_in - events_before;
  EXPECT_LE(events, 4) << "scale events under noise alone";
}

TEST(PlannerTest, HonoursStartUpTimeAndMeasuresIt) {
  PlannerOptions o = Options();
  o.startup_s = 120;
  Planner planner(o);
  PoolModel m;
  m.startup = 45;  // seen ready at the first snapshot 45 s after the ask: 50 s
  for (int i = 0; i < 6; ++i) m.Apply(planner.Decide(m.Step(4)));
  // A step up: the planner asks for more decode replicas once; while they start, it counts them
  // and never asks again for the same load.
  double asked_at = -1;
  int64_t scale_outs = 0;
  for (int i = 0; i < 20; ++i) {
    const Plan plan = planner.Decide(m.Step(12));
    const PoolDecision* d = Find(plan, PoolRole::kDecode);
    ASSERT_NE(d, nullptr);
    if (asked_at >= 0 && m.time - asked_at < 50) {
      EXPECT_EQ(d->starting, m.decode_spec - m.decode_ready) << d->detail;
      EXPECT_GT(d->starting, 0);
      EXPECT_NE(d->action, PlanAction::kScaleOut) << d->detail;
    }
    if (d->action == PlanAction::kScaleOut) {
      ++scale_outs;
      if (asked_at < 0) asked_at = m.time;
    }
    m.Apply(plan);
  }
  ASSERT_GT(asked_at, 0);
  EXPECT_GE(scale_outs, 1);  // (more later, as the trend settles: never while starting)
  EXPECT_NEAR(planner.startup_s(PoolRole::kDecode), 50, 1e-9);
  EXPECT_DOUBLE_EQ(planner.startup_s(PoolRole::kPrefill), 50);  // its scale-out took as long
}

TEST(PlannerTest, FloorsCeilingsAndWarmIdle) {
  PlannerOptions o = Options();
  o.limits[0].min_replicas = 1;
  o.limits[0].max_replicas = 4;
  o.limits[1].min_replicas = 2;
  o.limits[1].max_replicas = 3;
  o.limits[1].warm_idle = 1;
  o.cooldown_s = 0;
  o.scale_in_window_s = 0;
  Planner planner(o);
  PoolModel m;
  m.prefill_spec = m.prefill_ready = 3;
  m.decode_spec = m.decode_ready = 3;
  // Idle: down to the floors (decode: its floor, the warm idle replica is within it).
  for (int i = 0; i < 40; ++i) m.Apply(planner.Decide(m.Step(0)));
  EXPECT_EQ(m.prefill_spec, 1);
  EXPECT_EQ(m.decode_spec, 2);
  // A load far beyond the ceilings: up to them, never over.
  Plan plan;
  for (int i = 0; i < 10; ++i) {
    plan = planner.Decide(m.Step(100));
    m.Apply(plan);
  }
  EXPECT_EQ(m.prefill_spec, 4);
  EXPECT_EQ(m.decode_spec, 3);
  EXPECT_EQ(Find(plan, PoolRole::kDecode)->reason, "steady");
  EXPECT_GT(planner.counts().reasons.count("decode/scale_out/ceiling"), 0);
  // Warm idle: a light load that needs one decode worker keeps one more.
  PlannerOptions w = Options();
  w.limits[1].min_replicas = 1;
  w.limits[1].warm_idle = 1;
  Planner warm(w);
  PoolModel n;
  n.decode_spec = n.decode_ready = 1;
  for (int i = 0; i < 10; ++i) n.Apply(warm.Decide(n.Step(1)));  // 20k tokens: 0.45 of one
  EXPECT_EQ(n.decode_spec, 2);
}

TEST(PlannerTest, ScalesInAfterTheLoadDropsWithCooldownAndSteps) {
  PlannerOptions o = Options();
  o.max_scale_in_step = 0.25;
  Planner planner(o);
  PoolModel m;
  for (int i = 0; i < 30; ++i) m.Apply(planner.Decide(m.Step(16)));
  const int64_t peak = m.decode_spec;
  ASSERT_GE(peak, 8);
  std::vector<std::pair<double, int64_t>> ins;  // (time, removed)
  int64_t last = m.decode_spec;
  for (int i = 0; i < 100; ++i) {
    m.Apply(planner.Decide(m.Step(2)));
    if (m.decode_spec < last) ins.emplace_back(m.time, last - m.decode_spec);
    last = m.decode_spec;
  }
  EXPECT_LE(m.decode_spec, 2);
  ASSERT_GE(ins.size(), 2u);
  for (size_t i = 0; i < ins.size(); ++i) {
    EXPECT_LE(ins[i].second, std::max<int64_t>(1, peak / 4));
    if (i > 0) EXPECT_GE(ins[i].first - ins[i - 1].first, o.cooldown_s);
  }
  // The first scale-in waits for the lower need to hold over the window.
  EXPECT_GE(ins[0].first - 30 * kInterval, o.scale_in_window_s);
}

TEST(PlannerTest, RejectedScaleDoesNotStartTheCooldown) {
  PlannerOptions o = Options();
  o.scale_in_window_s = 0;
  Planner planner(o);
  PoolModel m;
  for (int i = 0; i < 10; ++i) m.Apply(planner.Decide(m.Step(16)));
  for (int i = 0; i < 10; ++i) planner.Decide(m.Step(16));
  // The load drops; the first scale-in is rejected by the actuator; the next interval tries again.
  int tries = 0;
  for (int i = 0; i < 20 && tries < 2; ++i) {
    const Plan plan = planner.Decide(m.Step(1));
    const PoolDecision* d = Find(plan, PoolRole::kDecode);
    if (d->action != PlanAction::kScaleIn) continue;
    ++tries;
    if (tries == 1) planner.Rejected(PoolRole::kDecode);
  }
  EXPECT_EQ(tries, 2);
}

TEST(PlannerTest, RouterRestartAndMissingRoutersHold) {
  Planner planner(Options());
  PoolModel m;
  for (int i = 0; i < 10; ++i) m.Apply(planner.Decide(m.Step(8)));
  const int64_t prefill = m.prefill_spec, decode = m.decode_spec;
  // No router answers: every pool holds.
  Snapshot none = m.Step(8);
  none.routers = 0;
  const Plan held = planner.Decide(none);
  for (const PoolDecision& d : held.pools) {
    EXPECT_EQ(d.action, PlanAction::kHold);
    EXPECT_EQ(d.reason, "no_router");
  }
  // The router restarted: its counters start again from zero; no negative rate, no panic.
  m.counters = RouterCounters();
  for (int i = 0; i < 3; ++i) {
    const Plan plan = planner.Decide(m.Step(8));
    for (const PoolDecision& d : plan.pools) {
      EXPECT_GE(d.demand_rate, 0);
      EXPECT_NE(d.action, PlanAction::kScaleIn) << d.detail;
    }
    m.Apply(plan);
  }
  EXPECT_EQ(m.prefill_spec, prefill);
  EXPECT_EQ(m.decode_spec, decode);
}

TEST(PlannerTest, QueueWaitsForAPoolAddOneThere) {
  Planner planner(Options());
  PoolModel m;
  for (int i = 0; i < 10; ++i) m.Apply(planner.Decide(m.Step(4)));
  Snapshot s = m.Step(4);
  // 20 requests waited 1.5 s on average for a decode worker (KV room).
  s.pool(PoolRole::kDecode).queue_wait_count = 20;
  s.pool(PoolRole::kDecode).queue_wait_seconds_sum = 30;
  const Plan plan = planner.Decide(s);
  const PoolDecision* d = Find(plan, PoolRole::kDecode);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->action, PlanAction::kScaleOut);
  EXPECT_EQ(d->reason, "queue_wait");
  EXPECT_EQ(d->desired, d->current + 1);
  EXPECT_EQ(Find(plan, PoolRole::kPrefill)->action, PlanAction::kHold);
}

}  // namespace
}  // namespace ferry
