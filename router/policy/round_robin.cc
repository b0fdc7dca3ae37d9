#include "router/policy/round_robin.h"

namespace ferry {

size_t RoundRobinPolicy::Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest&) {
  return static_cast<size_t>(next_.fetch_add(1) % candidates.size());
}

}  // namespace ferry
