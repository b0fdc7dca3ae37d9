// What one router says of the served system, read from its admin port's two pages: GET /workers
// (each worker's role, state and load as its Watch stream last reported it, and the router's own
// counts on it) and GET /metrics (its cumulative request, token and SLO counters, its queue and
// the queue waits per pool). MergeRouterViews sums several routers' views into the planner's
// Snapshot (pool_snapshot.h). snapshot_reader.h fetches the pages; this file only parses and adds.
//
//   /workers: a worker is placed in the pool its "role" names; one without a role yet (no status
//   received) is in no pool, and one the router has "removed" from its list is left out. Ready:
//   up, accepted and serving (drain_state SERVING); draining: drain_state DRAINING or DRAINED.
//   /metrics: ferry_router_requests_total (every endpoint and code), _prompt_tokens_total{source}
//   (prompt_tokens: computed + prefill_memory + store; decode_memory is a part of those),
//   _completion_tokens_total, _slo_requests_total{objective,result},
//   _queue_wait_seconds_sum/_count{pool}, _queue_depth, _queued_tokens.
//
// Merging: counters and the routers' queues add up; a worker several routers list (the same id)
// is one worker, with the load of the freshest report (the smallest last_message_ms_ago),
// draining when any router sees it draining, else ready when any sees it ready, and the routers'
// own counts on it (inflight, pending prefill and active tokens) summed.
//
// Pure functions over untrusted text: bad input is a Status, never a crash. Thread-safe.

#ifndef FERRY_SERVICES_PLANNER_ROUTER_VIEW_H_
#define FERRY_SERVICES_PLANNER_ROUTER_VIEW_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/planner/pool_snapshot.h"

namespace ferry {

// A worker as one router lists it.
struct ListedWorker {
  PoolRole pool = PoolRole::kAggregated;
  WorkerSample sample;
  int64_t last_message_ms_ago = 0;  // how old its load report is
};

struct RouterView {
  std::vector<ListedWorker> workers;
  RouterCounters counters;
  std::array<double, kPoolRoles> queue_wait_seconds_sum = {0, 0, 0};
  std::array<int64_t, kPoolRoles> queue_wait_count = {0, 0, 0};
  int64_t queued_requests = 0;
  int64_t queued_tokens = 0;
};

// Bounds on what a router's page may hold (a larger page is refused, not truncated).
inline constexpr size_t kMaxWorkersListed = 4096;
inline constexpr int kMaxJsonDepth = 16;

// GET /workers's body. Errors (InvalidArgument): not JSON, not an array of objects, deeper than
// kMaxJsonDepth, more than kMaxWorkersListed entries, a field of the wrong type or out of range.
absl::StatusOr<std::vector<ListedWorker>> ParseRouterWorkers(absl::string_view body);

// GET /metrics's body into `view`'s counters and queues. Errors (InvalidArgument): a bad line of
// a metric read (prometheus_text.h), a negative, fractional or non-finite count.
absl::Status ParseRouterMetrics(absl::string_view body, RouterView* view);

// Both pages of one router.
absl::StatusOr<RouterView> ParseRouterView(absl::string_view workers_body,
                                           absl::string_view metrics_body);

// The routers' views summed into a Snapshot at `time_s` (routers = views.size()). The actuator's
// fields (spec_replicas, starting) are left for the caller.
Snapshot MergeRouterViews(const std::vector<RouterView>& views, double time_s);

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_ROUTER_VIEW_H_
