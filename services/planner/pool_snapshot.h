// What the planner sees of the served system at one moment: per pool, the workers the router
// lists (their load as the router's GET /workers reports it) and the replicas the actuator knows
// of; the router's queue per pool; and the router's cumulative counters (requests, prompt tokens,
// SLO outcomes), summed over router replicas. The service builds it from HTTP (snapshot_reader.h),
// the simulator from its own state (tools/sim); the planner (planner.h) decides from it alone.
//
// Plain data; thread-compatible.

#ifndef FERRY_SERVICES_PLANNER_POOL_SNAPSHOT_H_
#define FERRY_SERVICES_PLANNER_POOL_SNAPSHOT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

// The pools the planner sizes. `./ferry scale` calls the aggregated pool "worker".
enum class PoolRole { kPrefill = 0, kDecode = 1, kAggregated = 2 };
inline constexpr int kPoolRoles = 3;
const char* PoolRoleName(PoolRole role);                      // "prefill", "decode", "aggregated"
bool ParsePoolRole(const std::string& name, PoolRole* role);  // also accepts "worker"

// One worker as the router last heard of it (its Watch stream's load report).
struct WorkerSample {
  std::string id;         // the router's id (its address)
  bool ready = false;     // up and accepting new requests
  bool draining = false;  // draining or drained: takes no new request, still counted until gone
  // The worker's load window (WorkerStatus.load_window_seconds): step time over wall time, the
  // prompt tokens per second of the steps that computed prompt tokens (0: none ran), and the
  // output tokens per second.
  double busy_fraction = 0;
  double prefill_tokens_per_second = 0;
  double decode_tokens_per_second = 0;
  double step_time_ms = 0;
  int64_t running_requests = 0;
  int64_t max_running_requests = 0;  // its --max_running (0: unknown)
  int64_t queued_requests = 0;       // waiting for admission on the worker
  int64_t queued_tokens = 0;         // their prompt tokens
  int64_t running_tokens = 0;        // positions of the running sequences
  int64_t block_tokens = 0;
  int64_t total_kv_blocks = 0, free_kv_blocks = 0, cached_kv_blocks = 0;
  // The router's own counts on it: requests it has there, prompt tokens it sent that are not
  // computed yet, and the tokens of streams it runs there.
  int64_t inflight = 0;
  int64_t pending_prefill_tokens = 0;
  int64_t active_tokens = 0;
};

// The KV the worker holds for running sequences, over its pool (0..1): the blocks not free and
// not merely cached, at least the running positions' (ferry_worker_kv_used_fraction's rule).
double KvUsedFraction(const WorkerSample& w);
// Running sequences over --max_running (0..1; 0 when unknown).
double RunningFraction(const WorkerSample& w);

struct PoolSample {
  std::vector<WorkerSample> workers;  // listed by the router, not removed
  // What the actuator knows: the replicas it last asked for (its spec; -1: unknown, then the
  // listed workers count), and of those, replicas that exist but are not ready yet (a pod
  // starting, a local worker loading its model).
  int64_t spec_replicas = -1;
  int64_t starting = 0;
  // Cumulative over the routers' lives: the queue waits observed for this pool
  // (ferry_router_queue_wait_seconds{pool}: sum and count).
  double queue_wait_seconds_sum = 0;
  int64_t queue_wait_count = 0;
};

// Cumulative router counters (summed over router replicas). The planner differences successive
// snapshots; a counter that went down (a router restarted) restarts the difference at zero.
struct RouterCounters {
  int64_t requests = 0;  // ferry_router_requests_total (every endpoint and code)
  // ferry_router_prompt_tokens_total: all sources, and source="computed" (the tokens a worker
  // had to compute: neither in its memory nor in the store).
  int64_t prompt_tokens = 0;
  int64_t computed_prompt_tokens = 0;
  int64_t completion_tokens = 0;  // ferry_router_completion_tokens_total
  // ferry_router_slo_requests_total{objective, result}.
  int64_t ttft_met = 0, ttft_missed = 0;
  int64_t itl_met = 0, itl_missed = 0;
};

struct Snapshot {
  double time_s = 0;  // monotonic (the service's clock, or the simulated time)
  std::array<PoolSample, kPoolRoles> pools;
  RouterCounters counters;
  // The routers' queue (ferry_router_queue_depth, ferry_router_queued_tokens): requests no
  // worker could take yet (none up, all busy, no decode worker with KV room), and their tokens.
  int64_t queued_requests = 0;
  int64_t queued_tokens = 0;
  int routers = 0;  // router replicas that answered (0: none; the planner then decides nothing)

  PoolSample& pool(PoolRole r) { return pools[static_cast<int>(r)]; }
  const PoolSample& pool(PoolRole r) const { return pools[static_cast<int>(r)]; }
};

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_POOL_SNAPSHOT_H_
