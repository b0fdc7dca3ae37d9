// What the Kubernetes actuator (kubernetes_actuator.h) reads and writes of the Kubernetes API, as
// JSON: the fields it needs of a Deployment, of a Deployment's scale subresource and of a pod list;
// the merge patches it sends; and the Status error of a failed call, with the API server's own
// message. The bodies come from the network (the API server, or whatever answers at its
// address): one that is not JSON, or a field of the wrong type or out of range, is an error that
// names the field, never a crash (kubernetes_objects_fuzz replays hostile bodies).
//
// Stateless functions; thread-safe.

#ifndef FERRY_SERVICES_PLANNER_KUBERNETES_OBJECTS_H_
#define FERRY_SERVICES_PLANNER_KUBERNETES_OBJECTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// The annotation that orders a ReplicaSet's scale-in: among ready pods, the lowest cost goes
// first (Kubernetes 1.22+, beta and on by default).
inline constexpr char kPodDeletionCostAnnotation[] = "controller.kubernetes.io/pod-deletion-cost";

// A Deployment (apps/v1), what the actuator reads of it.
struct DeploymentState {
  int64_t spec_replicas = 0;        // spec.replicas
  int64_t replicas = 0;             // status.replicas: its pods not terminating (absent: 0)
  int64_t ready_replicas = 0;       // status.readyReplicas (absent: 0)
  int64_t generation = 0;           // metadata.generation
  int64_t observed_generation = 0;  // status.observedGeneration (absent: 0)
};
// Errors: InvalidArgument (not JSON, not a Deployment, a field of the wrong type or negative).
absl::StatusOr<DeploymentState> ParseDeployment(absl::string_view body);

// A Deployment's scale subresource (autoscaling/v1 Scale).
struct ScaleState {
  int64_t spec_replicas = 0;     // spec.replicas (absent: 0, as the API server omits a zero)
  std::string resource_version;  // metadata.resourceVersion ("" when absent)
};
absl::StatusOr<ScaleState> ParseScale(absl::string_view body);

// One pod of a list (v1 PodList).
struct PodState {
  std::string name;           // metadata.name (never empty)
  std::string ip;             // status.podIP ("" until it has one)
  bool deleting = false;      // metadata.deletionTimestamp set: terminating
  std::string deletion_cost;  // its kPodDeletionCostAnnotation ("" when absent)
};
absl::StatusOr<std::vector<PodState>> ParsePodList(absl::string_view body);

// The merge patch (application/merge-patch+json) that sets a scale's spec.replicas; with a
// resource version, the API server applies it only if the object is still at that version (409
// Conflict otherwise), so that a scale never overwrites a change it did not see.
std::string ScalePatch(int64_t replicas, const std::string& resource_version);
// The merge patch that sets a pod's kPodDeletionCostAnnotation (an int32, as a string).
std::string PodDeletionCostPatch(int32_t cost);

// The error for HTTP status `http_code` (not 2xx) answering `what` ("GET /apis/..."): the code's
// absl equivalent (401 Unauthenticated, 403 PermissionDenied, 404 NotFound, 409 Aborted, 429 and
// 503 Unavailable, 504 DeadlineExceeded, other 4xx InvalidArgument or FailedPrecondition, other
// 5xx Internal), and a message with `what`, the code, and the API server's message (its Status
// object's "message"; else the start of the body), without control characters, at most 1 KiB.
absl::Status ApiError(int http_code, absl::string_view body, absl::string_view what);

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_KUBERNETES_OBJECTS_H_
