#include "tools/sim/sim_run.h"

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include "engine/common/status.h"

namespace ferry {

namespace {

// A seeded stream of uniform draws in [0, 1) (SplitMix64: the same numbers on every platform).
class Draws {
 public:
  explicit Draws(uint64_t seed) : state_(seed) {}
  double Uniform() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }
  double Exponential(double mean) { return mean > 0 ? -std::log1p(-Uniform()) * mean : 0; }

 private:
  uint64_t state_;
};

WorkerKind KindOf(PoolRole role) {
  return role == PoolRole::kPrefill  ? WorkerKind::kPrefill
         : role == PoolRole::kDecode ? WorkerKind::kDecode
                                     : WorkerKind::kAggregated;
}

absl::Duration Objective(double seconds) {
  return seconds > 0 ? absl::Seconds(seconds) : absl::InfiniteDuration();
}

}  // namespace

absl::StatusOr<SimRunResult> RunSimulation(const ClusterOptions& cluster_options,
                                           const Workload& workload, const SimRunOptions& options) {
  if (options.mode != "closed" && options.mode != "open") {
    return absl::InvalidArgumentError("mode must be closed or open");
  }
  if (options.mode == "closed" && options.concurrency < 1) {
    return absl::InvalidArgumentError("closed loop needs concurrency >= 1");
  }
  std::optional<Planner> planner;
  if (options.planner.has_value()) {
    RETURN_IF_ERROR(options.planner->Validate());
    planner.emplace(*options.planner);
  }
  const bool dynamic = planner.has_value() || options.scale != nullptr;
  const double interval =
      planner.has_value() ? options.planner->interval_s : options.scale_interval_s;
  if (dynamic && !(interval > 0)) return absl::InvalidArgumentError("the interval must be > 0");
  const auto wall_start = std::chrono::steady_clock::now();
  EventLoop loop;
  ClusterOptions with_slo = cluster_options;
  with_slo.slo.ttft = Objective(options.slo.ttft_s);
  with_slo.slo.itl = Objective(options.slo.tpot_s);
  ASSIGN_OR_RETURN(std::unique_ptr<ClusterSim> cluster, ClusterSim::Create(&loop, with_slo));
  // Units of work: a session's turns in order, or one request.
  std::vector<std::vector<size_t>> units;
  std::map<int64_t, size_t> session_unit;
  for (size_t i = 0; i < workload.requests.size(); ++i) {
    const LoadRequest& r = workload.requests[i];
    if (r.session < 0) {
      units.push_back({i});
      continue;
    }
    auto [it, added] = session_unit.emplace(r.session, units.size());
    if (added) units.emplace_back();
    units[it->second].push_back(i);
  }
  const bool sessions = !session_unit.empty();
  const bool jitter = sessions && options.jitter_sessions;
  Draws draws(options.seed);
  // The closed loop takes the units in this order.
  std::vector<size_t> order(units.size());
  for (size_t u = 0; u < order.size(); ++u) order[u] = u;
  if (jitter) {
    for (size_t i = order.size(); i > 1; --i) {
      const size_t j =
          std::min(i - 1, static_cast<size_t>(draws.Uniform() * static_cast<double>(i)));
      std::swap(order[i - 1], order[j]);
    }
  }
  SimRunResult result;
  result.records.resize(workload.requests.size());
  std::vector<bool> ended(workload.requests.size(), false);
  size_t next_unit = 0;
  int64_t done = 0;
  const int64_t total = static_cast<int64_t>(workload.requests.size());
  // Sends turn `turn` of unit `u`; `then` runs when the unit's last turn ended.
  std::function<void(size_t, size_t, std::function<void()>)> send;
  send = [&](size_t u, size_t turn, std::function<void()> then) {
    const size_t index = units[u][turn];
    cluster->Send(workload.requests[index], [&, u, turn, index,
                                             then = std::move(then)](const RequestRecord& record) {
      result.records[index] = record;
      ended[index] = true;
      ++done;
      if (turn + 1 < units[u].size()) {
        // The next turn after the think time, not before its own arrival.
        const double think = jitter ? draws.Exponential(workload.think_s) : workload.think_s;
        const double at =
            std::max(loop.now() + think, workload.requests[units[u][turn + 1]].arrival_s);
        loop.At(at, [&, u, turn, then] { send(u, turn + 1, then); });
      } else if (then) {
        then();
      }
    });
  };
  // Closed loop: a client sends its next unit when its previous one ended.
  std::function<void()> client = [&] {
    if (next_unit >= units.size()) return;
    send(order[next_unit++], 0, client);
  };
  if (options.mode == "open") {
    for (size_t u = 0; u < units.size(); ++u) {
      loop.At(workload.requests[units[u][0]].arrival_s, [&, u] { send(u, 0, nullptr); });
    }
  } else {
    for (int64_t c = 0; c < options.concurrency; ++c) {
      loop.After(jitter ? draws.Uniform() * workload.think_s : 0, client);
    }
  }
  // Pools at run time.
  std::function<void()> tick = [&] {
    const Snapshot snapshot = cluster->PlannerSnapshot();
    TimelinePoint point;
    point.time_s = loop.now();
    point.gpu_seconds = cluster->gpu_seconds();
    for (int r = 0; r < kPoolRoles; ++r) {
      point.pools[static_cast<size_t>(r)] = cluster->pool_counts(KindOf(static_cast<PoolRole>(r)));
      point.desired[static_cast<size_t>(r)] = -1;
    }
    if (planner.has_value()) {
      const Plan plan = planner->Decide(snapshot);
      if (options.on_plan) options.on_plan(plan);
      for (const PoolDecision& d : plan.pools) {
        const WorkerKind kind = KindOf(d.pool);
        point.desired[static_cast<size_t>(d.pool)] = d.desired;
        const PoolCounts counts = cluster->pool_counts(kind);
        int64_t have = counts.starting + counts.ready;
        bool applied = true;
        for (; applied && have < d.desired; ++have) {
          applied = cluster->AddWorker(kind, options.startup_s).ok();
        }
        for (; applied && have > d.desired; --have) applied = cluster->DrainWorker(kind).ok();
        if (!applied) planner->Rejected(d.pool);
      }
    }
    if (options.scale) options.scale(*cluster, snapshot);
    result.timeline.push_back(point);
    if (done < total) loop.After(interval, tick);
  };
  if (dynamic) loop.After(interval, tick);
  loop.Run(options.max_sim_seconds, [&] { return done >= total; });
  result.sim_seconds = loop.now();
  result.events = loop.events_run();
  result.gpus = cluster->gpus();
  result.gpu_seconds = cluster->gpu_seconds();
  result.cluster = cluster->stats();
  result.counters = cluster->counters();
  if (planner.has_value()) result.planner = planner->counts();
  result.worker_kv_tokens = cluster->worker_kv_tokens();
  result.gpus_per_worker = std::max(1, cluster_options.calibration.gpus_per_worker);
  result.workers = cluster_options.aggregated + cluster_options.prefill + cluster_options.decode;
  for (size_t i = 0; i < result.records.size(); ++i) {
    if (ended[i]) continue;
    result.records[i] = RequestRecord();  // never sent, or never ended
    result.records[i].id = workload.requests[i].id;
    result.records[i].prompt_tokens = static_cast<int64_t>(workload.requests[i].prompt.size());
    result.records[i].error = "did not end within the simulated time";
  }
  result.summary = Summarize(result.records, options.slo, options.prices, result.gpus);
  if (dynamic) {  // the GPUs changed: their hours are the workers' lives
    RunSummary& s = result.summary;
    s.gpu_hours = result.gpu_seconds / 3600.0;
    s.revenue_per_gpu_hour = s.gpu_hours > 0 ? s.revenue / s.gpu_hours : 0;
    s.revenue_per_gpu_hour_within_slo = s.gpu_hours > 0 ? s.revenue_within_slo / s.gpu_hours : 0;
  }
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return result;
}

nlohmann::json SimRunJson(const SimRunResult& result, const SimRunOptions& options) {
  nlohmann::json j = SummaryJson(result.summary, options.prices);
  const ClusterStats& c = result.cluster;
  j["sim_seconds"] = result.sim_seconds;
  j["wall_seconds"] = result.wall_seconds;
  j["events"] = result.events;
  j["worker_kv_tokens"] = result.worker_kv_tokens;
  j["routing_reasons"] = c.reasons;
  j["router_queued"] = c.queued;
  j["retries"] = c.retries;
  j["kv_waits"] = c.kv_waits;
  j["queue_expired"] = c.queue_expired;
  j["max_queue_wait_s"] = c.max_queue_wait_s;
  j["store_reads"] = c.store_reads;
  j["store_blocks_read"] = c.store_blocks_read;
  j["handoff_gb"] = c.handoff_bytes / 1e9;
  j["store_read_gb"] = c.store_bytes_read / 1e9;
  j["kv_index_entries"] = c.index_entries;
  j["store_lookups"] = c.store_lookups;
  j["gpu_seconds"] = result.gpu_seconds;
  const bool dynamic = !result.timeline.empty();
  const double worker_seconds = dynamic ? result.gpu_seconds / std::max(1, result.gpus_per_worker)
                                        : result.sim_seconds * static_cast<double>(result.workers);
  j["gpu_utilization"] = worker_seconds > 0 ? c.busy_seconds / worker_seconds : 0.0;
  const RouterCounters& k = result.counters;
  j["router_counters"] = {{"requests", k.requests},
                          {"prompt_tokens", k.prompt_tokens},
                          {"computed_prompt_tokens", k.computed_prompt_tokens},
                          {"completion_tokens", k.completion_tokens},
                          {"ttft_met", k.ttft_met},
                          {"ttft_missed", k.ttft_missed},
                          {"itl_met", k.itl_met},
                          {"itl_missed", k.itl_missed}};
  if (dynamic) {
    j["pools"] = {{"workers_added", c.workers_added},
                  {"workers_drained", c.workers_drained},
                  {"workers_gone", c.workers_gone},
                  {"drain_handoffs", c.drain_handoffs},
                  {"drain_handoff_gb", c.drain_handoff_bytes / 1e9},
                  {"drain_handoff_waits", c.drain_handoff_waits}};
    const PlannerCounts& p = result.planner;
    j["planner"] = {{"decisions", p.decisions},
                    {"scale_out", p.scale_out},
                    {"scale_in", p.scale_in},
                    {"scale_events", p.scale_out + p.scale_in},
                    {"scale_in_blocked_by_utilisation", p.scale_in_blocked_by_utilisation},
                    {"scale_in_blocked_by_cooldown", p.scale_in_blocked_by_cooldown},
                    {"reasons", p.reasons}};
    nlohmann::json timeline = nlohmann::json::array();
    for (const TimelinePoint& t : result.timeline) {
      nlohmann::json point = {{"t", t.time_s}, {"gpu_seconds", t.gpu_seconds}};
      for (int r = 0; r < kPoolRoles; ++r) {
        const PoolCounts& pc = t.pools[static_cast<size_t>(r)];
        if (pc.starting + pc.ready + pc.draining == 0 && t.desired[static_cast<size_t>(r)] < 0) {
          continue;
        }
        point[PoolRoleName(static_cast<PoolRole>(r))] = {
            {"ready", pc.ready},
            {"starting", pc.starting},
            {"draining", pc.draining},
            {"desired", t.desired[static_cast<size_t>(r)]}};
      }
      timeline.push_back(std::move(point));
    }
    j["timeline"] = std::move(timeline);
  }
  return j;
}

}  // namespace ferry
