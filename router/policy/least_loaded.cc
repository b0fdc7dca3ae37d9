#include "router/policy/least_loaded.h"

#include <tuple>
#include <vector>

namespace ferry {

size_t LeastLoadedPolicy::Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest&) {
  auto key = [](const WorkerLoadView& w) {
    return std::make_tuple(w.inflight, w.queued_tokens + w.running_tokens);
  };
  std::vector<size_t> best;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (best.empty() || key(candidates[i]) < key(candidates[best[0]])) {
      best.assign(1, i);
    } else if (key(candidates[i]) == key(candidates[best[0]])) {
      best.push_back(i);
    }
  }
  if (best.size() == 1) return best[0];
  absl::MutexLock lock(&mu_);
  return best[std::uniform_int_distribution<size_t>(0, best.size() - 1)(rng_)];
}

}  // namespace ferry
