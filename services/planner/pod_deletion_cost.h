// Which pods a scale-in should remove: the Kubernetes actuator sets each pod's
// controller.kubernetes.io/pod-deletion-cost from the load its worker carries, before it lowers a
// Deployment's replicas, so that the ReplicaSet deletes the least-loaded pods (among ready pods the
// lowest cost goes first; not-ready pods go before any ready one whatever their cost).
//
// A pod is matched to the router's view of its worker by IP: the pod's status.podIP is the host of
// the worker's address (its id; the workers advertise their pod IP). The cost:
//   0          a pod no listed worker matches (starting, or unknown to the router), or whose
//              worker is draining or not ready: removing it loses nothing;
//   1 + rank   the others, ranked by load ascending (equal loads, equal costs): the requests the
//              worker holds (the larger of the router's in-flight count and the worker's running
//              plus queued requests: what a drain must finish or hand off), then the tokens of
//              its running sequences (the KV a hand-off must move).
// Pure and deterministic (decisions apart from I/O); thread-safe.

#ifndef FERRY_SERVICES_PLANNER_POD_DELETION_COST_H_
#define FERRY_SERVICES_PLANNER_POD_DELETION_COST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "services/planner/pool_snapshot.h"

namespace ferry {

// The pod IP a worker's address names: the host of "host:port" or "[v6]:port", brackets removed.
std::string WorkerPodIp(absl::string_view worker_id);

// The cost of each pod (pod_ips[i] -> result[i]; "" for a pod without an IP yet), from `workers`
// (the pool as the router lists it).
std::vector<int32_t> PodDeletionCosts(const std::vector<std::string>& pod_ips,
                                      const std::vector<WorkerSample>& workers);

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_POD_DELETION_COST_H_
