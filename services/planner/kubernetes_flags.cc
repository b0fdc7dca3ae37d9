#include "services/planner/kubernetes_flags.h"

#include <string>

#include "absl/flags/flag.h"

namespace {
const ferry::KubernetesActuatorOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, kubernetes_api_server, "",
          "--actuator=kubernetes: the API server, https://HOST:PORT (empty: "
          "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, as in a pod)");
ABSL_FLAG(std::string, kubernetes_namespace, "",
          "--actuator=kubernetes: the Deployments' namespace (empty: the pod's own, from the "
          "service account's namespace file)");
ABSL_FLAG(std::string, kubernetes_token_file, kDefaults.token_file,
          "--actuator=kubernetes: the service account's bearer token (read for every request)");
ABSL_FLAG(std::string, kubernetes_ca_file, kDefaults.ca_file,
          "--actuator=kubernetes: the CA certificates the API server's certificate must chain to");
ABSL_FLAG(std::string, prefill_deployment, kDefaults.deployments[0],
          "--actuator=kubernetes: the prefill pool's Deployment (empty: not managed)");
ABSL_FLAG(std::string, decode_deployment, kDefaults.deployments[1],
          "--actuator=kubernetes: the decode pool's Deployment (empty: not managed)");
ABSL_FLAG(std::string, aggregated_deployment, kDefaults.deployments[2],
          "--actuator=kubernetes: the aggregated pool's Deployment (empty: not managed)");
ABSL_FLAG(std::string, prefill_pod_selector, kDefaults.pod_selectors[0],
          "--actuator=kubernetes: the label selector of the prefill pool's pods (their "
          "pod-deletion-cost is set before a scale-in)");
ABSL_FLAG(std::string, decode_pod_selector, kDefaults.pod_selectors[1],
          "--actuator=kubernetes: the label selector of the decode pool's pods");
ABSL_FLAG(std::string, aggregated_pod_selector, kDefaults.pod_selectors[2],
          "--actuator=kubernetes: the label selector of the aggregated pool's pods");

namespace ferry {

KubernetesActuatorOptions KubernetesActuatorOptionsFromFlags() {
  KubernetesActuatorOptions o;
  o.api_server = absl::GetFlag(FLAGS_kubernetes_api_server);
  o.namespace_name = absl::GetFlag(FLAGS_kubernetes_namespace);
  o.token_file = absl::GetFlag(FLAGS_kubernetes_token_file);
  o.ca_file = absl::GetFlag(FLAGS_kubernetes_ca_file);
  o.deployments = {absl::GetFlag(FLAGS_prefill_deployment), absl::GetFlag(FLAGS_decode_deployment),
                   absl::GetFlag(FLAGS_aggregated_deployment)};
  o.pod_selectors = {absl::GetFlag(FLAGS_prefill_pod_selector),
                     absl::GetFlag(FLAGS_decode_pod_selector),
                     absl::GetFlag(FLAGS_aggregated_pod_selector)};
  return o;
}

}  // namespace ferry
