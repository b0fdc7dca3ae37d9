// The Kubernetes actuator (actuator.h): sizes the pools by their Deployments' scale subresource,
// through the API server, as the pod's service account (deploy/k8s/components/planner holds its
// RBAC: the calls below and nothing more).
//
//   Replicas(pool)  GET /apis/apps/v1/namespaces/NS/deployments/NAME: spec.replicas,
//                   status.readyReplicas; `changing` while the Deployment controller has not yet
//                   acted on the latest spec (status.observedGeneration behind
//                   metadata.generation) or its pods are not yet as many as asked
//                   (status.replicas != spec.replicas: pods being created or a rollout's surge).
//   Scale(pool, n)  GET .../deployments/NAME/scale (spec.replicas, metadata.resourceVersion); the
//                   same count: nothing more. Scale-in: first GET /api/v1/namespaces/NS/pods?
//                   labelSelector=SELECTOR and PATCH each pod not terminating whose
//                   controller.kubernetes.io/pod-deletion-cost differs from its cost
//                   (pod_deletion_cost.h: the least-loaded ready pods lowest, so the ReplicaSet
//                   removes those); a pod gone meanwhile (404) is skipped. Then PATCH
//                   .../deployments/NAME/scale with {"metadata":{"resourceVersion":RV},
//                   "spec":{"replicas":n}}: applied only if the Deployment is unchanged since
//                   the read, so a scale never overwrites a change it did not see (kubectl, a
//                   rollout). On 409 Conflict the scale is read again and, if its replicas are
//                   still what was read (only the status moved), patched again
//                   (conflict_retries times); if they changed, Aborted: the planner decides
//                   again from the next snapshot.
// Patches are application/merge-patch+json; every request carries the service account's bearer
// token (re-read for every request: projected tokens rotate) and is verified against its CA
// (kubernetes_client.h).
//
// Errors: a call's Status with the API server's message (kubernetes_objects.h ApiError: 403
// PermissionDenied, 404 NotFound, 409 Aborted, ...); DeadlineExceeded when the deadline passes
// (every call shares the caller's deadline); Unavailable when the server cannot be reached or
// its certificate is not trusted; InvalidArgument for a response that is not the object asked
// for; a pool with no Deployment configured: NotFound. A failed scale-in may have set some
// pods' costs and not the replicas: harmless, the next scale-in sets them again.
//
// Thread-compatible (actuator.h); every call returns by its deadline.

#ifndef FERRY_SERVICES_PLANNER_KUBERNETES_ACTUATOR_H_
#define FERRY_SERVICES_PLANNER_KUBERNETES_ACTUATOR_H_

#include <array>
#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/planner/actuator.h"
#include "services/planner/pool_snapshot.h"

namespace ferry {

// Where Kubernetes mounts a pod's service account: token, ca.crt, namespace.
inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

struct KubernetesActuatorOptions {
  // "https://HOST[:PORT]"; empty: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT,
  // which every pod is given. "http://" only for tests against a mock.
  std::string api_server;
  // The service account's bearer token (empty: none sent) and the CA of the API server.
  std::string token_file = std::string(kServiceAccountDir) + "/token";
  std::string ca_file = std::string(kServiceAccountDir) + "/ca.crt";
  // The Deployments' namespace; empty: the content of namespace_file (the pod's own namespace).
  std::string namespace_name;
  std::string namespace_file = std::string(kServiceAccountDir) + "/namespace";
  // Per pool (indexed by PoolRole): its Deployment, and the label selector of its pods. An empty
  // Deployment name: the pool is not managed here (NotFound). deploy/k8s has no aggregated pool.
  std::array<std::string, kPoolRoles> deployments = {"ferry-prefill", "ferry-decode", ""};
  std::array<std::string, kPoolRoles> pod_selectors = {
      "app.kubernetes.io/name=ferry,app.kubernetes.io/component=prefill",
      "app.kubernetes.io/name=ferry,app.kubernetes.io/component=decode", ""};
  // The largest response accepted (a pod list of a large pool: about 10 KiB a pod).
  size_t max_response_bytes = 16 << 20;
  // Patches of the scale tried again after a 409 Conflict that left its replicas unchanged.
  int conflict_retries = 2;
};

// The in-cluster API server URL from KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT's
// values (an IPv6 host bracketed). FailedPrecondition when either is empty (not in a pod).
absl::StatusOr<std::string> InClusterApiServer(absl::string_view host, absl::string_view port);

// Resolves the defaults (the API server from the environment, the namespace from its file) and
// checks the URL and the CA file. Errors: not in a pod and no api_server (FailedPrecondition),
// the namespace file unreadable, a bad URL or CA file (kubernetes_client.h), a managed pool
// without a pod selector (InvalidArgument). The token file is read by each call, not here.
absl::StatusOr<std::unique_ptr<Actuator>> NewKubernetesActuator(KubernetesActuatorOptions options);

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_KUBERNETES_ACTUATOR_H_
