#include "router/policy/routing_policy.h"

#include "absl/strings/str_cat.h"
#include "router/policy/least_loaded.h"
#include "router/policy/prefix_aware.h"
#include "router/policy/round_robin.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<RoutingPolicy>> NewRoutingPolicy(const std::string& name,
                                                                uint64_t seed, const KvIndex* index,
                                                                PrefixAwareOptions prefix_options) {
  if (name == "round_robin") return std::unique_ptr<RoutingPolicy>(new RoundRobinPolicy());
  if (name == "least_loaded") return std::unique_ptr<RoutingPolicy>(new LeastLoadedPolicy(seed));
  if (name == "prefix_aware") {
    if (index == nullptr) return absl::InvalidArgumentError("prefix_aware needs the KV index");
    return std::unique_ptr<RoutingPolicy>(new PrefixAwarePolicy(index, prefix_options, seed));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown routing policy '", name,
                                                 "' (round_robin, least_loaded, prefix_aware)"));
}

}  // namespace ferry
