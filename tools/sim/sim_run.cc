#include "tools/sim/sim_run.h"

#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include "engine/common/status.h"

namespace ferry {

absl::StatusOr<SimRunResult> RunSimulation(const ClusterOptions& cluster_options,
                                           const Workload& workload, const SimRunOptions& options) {
  if (options.mode != "closed" && options.mode != "open") {
    return absl::InvalidArgumentError("mode must be closed or open");
  }
  if (options.mode == "closed" && options.concurrency < 1) {
    return absl::InvalidArgumentError("closed loop needs concurrency >= 1");
  }
  const auto wall_start = std::chrono::steady_clock::now();
  EventLoop loop;
  ASSIGN_OR_RETURN(std::unique_ptr<ClusterSim> cluster, ClusterSim::Create(&loop, cluster_options));
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
    cluster->Send(workload.requests[index],
                  [&, u, turn, index, then = std::move(then)](const RequestRecord& record) {
                    result.records[index] = record;
                    ended[index] = true;
                    ++done;
                    if (turn + 1 < units[u].size()) {
                      send(u, turn + 1, then);
                    } else if (then) {
                      then();
                    }
                  });
  };
  // Closed loop: a client sends its next unit when its previous one ended.
  std::function<void()> client = [&] {
    if (next_unit >= units.size()) return;
    send(next_unit++, 0, client);
  };
  if (options.mode == "open") {
    for (size_t u = 0; u < units.size(); ++u) {
      loop.At(workload.requests[units[u][0]].arrival_s, [&, u] { send(u, 0, nullptr); });
    }
  } else {
    for (int64_t c = 0; c < options.concurrency; ++c) loop.After(0, client);
  }
  loop.Run(options.max_sim_seconds, [&] { return done >= total; });
  result.sim_seconds = loop.now();
  result.events = loop.events_run();
  result.gpus = cluster->gpus();
  result.cluster = cluster->stats();
  result.worker_kv_tokens = cluster->worker_kv_tokens();
  result.workers = cluster_options.aggregated + cluster_options.prefill + cluster_options.decode;
  for (size_t i = 0; i < result.records.size(); ++i) {
    if (ended[i]) continue;
    result.records[i] = RequestRecord();  // never sent, or never ended
    result.records[i].id = workload.requests[i].id;
    result.records[i].prompt_tokens = static_cast<int64_t>(workload.requests[i].prompt.size());
    result.records[i].error = "did not end within the simulated time";
  }
  result.summary = Summarize(result.records, options.slo, options.prices, result.gpus);
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
  j["gpu_utilization"] =
      result.sim_seconds > 0 && result.workers > 0
          ? c.busy_seconds / (result.sim_seconds * static_cast<double>(result.workers))
          : 0.0;
  return j;
}

}  // namespace ferry
