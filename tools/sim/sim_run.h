// One run of the discrete-event simulator: a workload (tools/load/workload.h) driven into a
// simulated cluster (cluster_sim.h) open loop (each request, or session, at its arrival time) or
// closed loop (`concurrency` clients, each sending its next request, or session, when the
// previous one ended), summarised as the load tool summarises a real run (load_report.h), with
// the simulated time as the run's duration.
//
// Session turns follow their previous turn at once (the workload's think time is not
// simulated).

#ifndef FERRY_TOOLS_SIM_SIM_RUN_H_
#define FERRY_TOOLS_SIM_SIM_RUN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/load/load_report.h"
#include "tools/load/workload.h"
#include "tools/sim/cluster_sim.h"

namespace ferry {

struct SimRunOptions {
  std::string mode = "closed";     // "closed" or "open"
  int64_t concurrency = 64;        // closed loop
  double max_sim_seconds = 36000;  // stops a run that would not end
  Slo slo;
  Prices prices;
};

struct SimRunResult {
  std::vector<RequestRecord> records;  // by request id
  RunSummary summary;
  ClusterStats cluster;
  double sim_seconds = 0;   // simulated
  double wall_seconds = 0;  // what the simulation took
  int64_t events = 0;
  int gpus = 0;
  int workers = 0;
  int64_t worker_kv_tokens = 0;
};

absl::StatusOr<SimRunResult> RunSimulation(const ClusterOptions& cluster, const Workload& workload,
                                           const SimRunOptions& options);

// The run as one JSON object: the summary's fields (SummaryJson) plus the cluster's.
nlohmann::json SimRunJson(const SimRunResult& result, const SimRunOptions& options);

}  // namespace ferry

#endif  // FERRY_TOOLS_SIM_SIM_RUN_H_
