// One run of the discrete-event simulator: a workload (tools/load/workload.h) driven into a
// simulated cluster (cluster_sim.h) open loop (each request, or session, at its arrival time) or
// closed loop (`concurrency` clients, each sending its next request, or session, when the
// previous one ended), summarised as the load tool summarises a real run (load_report.h), with
// the simulated time as the run's duration.
//
// Sessions are jittered, so that no routing policy meets them in lockstep: each turn after the
// first is sent an exponential think time (mean: the workload's think_s, seeded) after its
// previous turn ended (and not before its own arrival_s); in the closed loop the sessions start in
// a seeded random order, each client's first one after a uniform delay in [0, think_s).
//
// Pools at run time: every `interval` the run reads the cluster's planner snapshot and either
// lets the planner (services/planner) decide and applies its decisions (a pool asked to grow gets
// AddWorker x the difference, with `startup_s`; one asked to shrink DrainWorker x the
// difference), or calls `scale` (a test's or a bench's own rule). The result's GPU-hours are then
// the cluster's GPU-seconds (each worker's life); a static run's stay Summarize's (GPUs x the
// run's duration), the same figure when the run starts at 0.

#ifndef FERRY_TOOLS_SIM_SIM_RUN_H_
#define FERRY_TOOLS_SIM_SIM_RUN_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/planner/planner.h"
#include "services/planner/pool_snapshot.h"
#include "tools/load/load_report.h"
#include "tools/load/workload.h"
#include "tools/sim/cluster_sim.h"

namespace ferry {

struct SimRunOptions {
  std::string mode = "closed";     // "closed" or "open"
  int64_t concurrency = 64;        // closed loop
  double max_sim_seconds = 36000;  // stops a run that would not end
  Slo slo;                         // also the cluster's SLO objectives (0: none)
  Prices prices;
  uint64_t seed = 1;  // the sessions' jitter
  bool jitter_sessions = true;
  // Pools at run time: the planner, or a rule of the caller's (the planner first when both).
  std::optional<PlannerOptions> planner;
  std::function<void(ClusterSim&, const Snapshot&)> scale;
  std::function<void(const Plan&)> on_plan;  // each of the planner's plans (a log; may be empty)
  double scale_interval_s = 10;              // `scale`'s interval (the planner's is its interval_s)
  double startup_s = 60;                     // a new worker's start-up time
};

// The pools at one interval (before the decisions taken then), by PoolRole.
struct TimelinePoint {
  double time_s = 0;
  std::array<PoolCounts, kPoolRoles> pools;
  std::array<int64_t, kPoolRoles> desired{};  // the planner's (-1: not decided)
  double gpu_seconds = 0;                     // so far
};

struct SimRunResult {
  std::vector<RequestRecord> records;  // by request id
  RunSummary summary;
  ClusterStats cluster;
  double sim_seconds = 0;   // simulated
  double wall_seconds = 0;  // what the simulation took
  int64_t events = 0;
  int gpus = 0;     // at the end
  int workers = 0;  // at the start
  int gpus_per_worker = 1;
  int64_t worker_kv_tokens = 0;
  double gpu_seconds = 0;               // every worker's life, x gpus_per_worker
  std::vector<TimelinePoint> timeline;  // runs with a planner or `scale`
  PlannerCounts planner;
  RouterCounters counters;  // the router's, at the end
};

absl::StatusOr<SimRunResult> RunSimulation(const ClusterOptions& cluster, const Workload& workload,
                                           const SimRunOptions& options);

// The run as one JSON object: the summary's fields (SummaryJson) plus the cluster's.
nlohmann::json SimRunJson(const SimRunResult& result, const SimRunOptions& options);

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_SIM_RUN_H_
