#include "services/planner/pod_deletion_cost.h"

#include <algorithm>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "services/common/host_port.h"

namespace ferry {

std::string WorkerPodIp(absl::string_view worker_id) {
  absl::string_view host = HostOfAddress(worker_id);
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  return std::string(host);
}

namespace {

// (requests held, running tokens): what removing the worker must drain or hand off.
using Load = std::pair<int64_t, int64_t>;

Load LoadOf(const WorkerSample& w) {
  return Load(std::max(w.inflight, w.running_requests + w.queued_requests), w.running_tokens);
}

}  // namespace

std::vector<int32_t> PodDeletionCosts(const std::vector<std::string>& pod_ips,
                                      const std::vector<WorkerSample>& workers) {
  // The first worker listed at each IP (a worker appears once per router view).
  std::map<std::string, const WorkerSample*> by_ip;
  for (const WorkerSample& w : workers) by_ip.emplace(WorkerPodIp(w.id), &w);
  std::vector<const WorkerSample*> matched(pod_ips.size(), nullptr);
  std::vector<Load> loads;
  for (size_t i = 0; i < pod_ips.size(); ++i) {
    if (pod_ips[i].empty()) continue;
    const auto it = by_ip.find(pod_ips[i]);
    if (it == by_ip.end() || !it->second->ready || it->second->draining) continue;
    matched[i] = it->second;
    loads.push_back(LoadOf(*it->second));
  }
  std::sort(loads.begin(), loads.end());
  loads.erase(std::unique(loads.begin(), loads.end()), loads.end());
  std::vector<int32_t> costs(pod_ips.size(), 0);
  for (size_t i = 0; i < pod_ips.size(); ++i) {
    if (matched[i] == nullptr) continue;
    const auto rank =
        std::lower_bound(loads.begin(), loads.end(), LoadOf(*matched[i])) - loads.begin();
    costs[i] =
        static_cast<int32_t>(std::min<int64_t>(1 + rank, std::numeric_limits<int32_t>::max()));
  }
  return costs;
}

}  // namespace ferry
