// The routing policy seam (STYLE.md §3; ARCHITECTURE.md §6): which of the workers that can take a
// request now gets it. The registry and the dispatcher decide who is a candidate (up, accepted
// into the pool, not draining, below its capacity); a policy only chooses among them.
//
//   round_robin   in turn, skipping none
//   least_loaded  the fewest requests in flight (the router's own count, exact at once), then the
//                 fewest tokens queued and running as the worker last reported, ties at random
//
// The prefix- and speed-aware policy of a later issue implements the same interface.
//
// Thread-safe implementations (the dispatcher calls Pick from several threads).

#ifndef FERRY_ROUTER_POLICY_ROUTING_POLICY_H_
#define FERRY_ROUTER_POLICY_ROUTING_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ferry {

// What a policy knows of one candidate.
struct WorkerLoadView {
  std::string id;
  int64_t inflight = 0;       // requests the router has running there
  int64_t queued_tokens = 0;  // as the worker last reported
  int64_t running_tokens = 0;
  int64_t free_kv_blocks = 0;
};

// What a policy knows of the request.
struct RouteRequest {
  int64_t prompt_tokens = 0;
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual const char* name() const = 0;
  // The index of the chosen candidate; `candidates` is not empty.
  virtual size_t Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest& request) = 0;
};

// "round_robin" or "least_loaded"; InvalidArgument for another name.
absl::StatusOr<std::unique_ptr<RoutingPolicy>> NewRoutingPolicy(const std::string& name,
                                                                uint64_t seed = 0);

}  // namespace ferry

#endif  // FERRY_ROUTER_POLICY_ROUTING_POLICY_H_
