// ferry-planner's flags for the Kubernetes actuator (--actuator=kubernetes; kubernetes_actuator.h),
// declared here so that the main stays thin and lists them in --help once it links this:
//
//   --kubernetes_api_server   https://HOST:PORT ("": the pod's KUBERNETES_SERVICE_HOST/PORT)
//   --kubernetes_namespace    the Deployments' namespace ("": the pod's own)
//   --kubernetes_token_file, --kubernetes_ca_file   the service account's token and CA
//   --prefill_deployment, --decode_deployment, --aggregated_deployment   each pool's Deployment
//                             ("": the pool is not managed)
//   --prefill_pod_selector, --decode_pod_selector, --aggregated_pod_selector   its pods' labels
//
// The defaults are the options' (in a pod of deploy/k8s, no flag is needed). Thread-safe.

#ifndef FERRY_SERVICES_PLANNER_KUBERNETES_FLAGS_H_
#define FERRY_SERVICES_PLANNER_KUBERNETES_FLAGS_H_

#include "services/planner/kubernetes_actuator.h"

namespace ferry {

// The options the flags above give.
KubernetesActuatorOptions KubernetesActuatorOptionsFromFlags();

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_KUBERNETES_FLAGS_H_
