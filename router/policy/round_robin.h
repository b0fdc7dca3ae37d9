// round_robin: candidates in turn (routing_policy.h).

#ifndef FERRY_ROUTER_POLICY_ROUND_ROBIN_H_
#define FERRY_ROUTER_POLICY_ROUND_ROBIN_H_

#include <atomic>

#include "router/policy/routing_policy.h"

namespace ferry {

// Thread-safe.
class RoundRobinPolicy final : public RoutingPolicy {
 public:
  const char* name() const override { return "round_robin"; }
  size_t Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest& request) override;

 private:
  std::atomic<uint64_t> next_{0};
};

}  // namespace ferry

#endif  // FERRY_ROUTER_POLICY_ROUND_ROBIN_H_
