// least_loaded: the fewest requests in flight, then the fewest reported tokens queued and
// running, ties broken at random (routing_policy.h).

#ifndef FERRY_ROUTER_POLICY_LEAST_LOADED_H_
#define FERRY_ROUTER_POLICY_LEAST_LOADED_H_

#include <cstdint>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "router/policy/routing_policy.h"

namespace ferry {

// Thread-safe.
class LeastLoadedPolicy final : public RoutingPolicy {
 public:
  explicit LeastLoadedPolicy(uint64_t seed) : rng_(seed) {}
  const char* name() const override { return "least_loaded"; }
  size_t Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest& request) override;

 private:
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_ROUTER_POLICY_LEAST_LOADED_H_
