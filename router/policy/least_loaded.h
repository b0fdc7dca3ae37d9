// least_loaded: the fewest requests in flight, then the fewest reported tokens queued and
// running, ties broken at random (routing_policy.h).

#ifndef FERRY_ROUTER_POLICY_LEAST_LOADED_H_
#define FERRY_ROUTER_POLICY_LEAST_LOADED_H_

#include <cstdint>
#include <mutex>
#include <random>

#include "router/policy/routing_policy.h"

namespace ferry {

// Thread-safe.
class LeastLoadedPolicy final : public RoutingPolicy {
 public:
  explicit LeastLoadedPolicy(uint64_t seed) : rng_(seed) {}
  const char* name() const override { return "least_loaded"; }
  size_t Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest& request) override;

 private:
  std::mutex mu_;
  std::mt19937_64 rng_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_POLICY_LEAST_LOADED_H_
