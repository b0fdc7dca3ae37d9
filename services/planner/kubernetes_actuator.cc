#include "services/planner/kubernetes_actuator.h"

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "services/common/host_port.h"
#include "services/planner/kubernetes_client.h"
#include "services/planner/kubernetes_objects.h"
#include "services/planner/pod_deletion_cost.h"

namespace ferry {
namespace {

constexpr char kMergePatch[] = "application/merge-patch+json";

class KubernetesActuator : public Actuator {
 public:
  KubernetesActuator(KubernetesActuatorOptions options, std::unique_ptr<KubernetesClient> client)
      : options_(std::move(options)), client_(std::move(client)) {}

  const char* name() const override { return "kubernetes"; }

  absl::StatusOr<PoolReplicas> Replicas(PoolRole pool, absl::Time deadline) override {
    ASSIGN_OR_RETURN(const std::string deployment, Deployment(pool));
    ASSIGN_OR_RETURN(const std::string body,
                     client_->Call({"GET", DeploymentPath(deployment), "", "", ""}, deadline));
    ASSIGN_OR_RETURN(const DeploymentState d, ParseDeployment(body));
    PoolReplicas out;
    out.spec = d.spec_replicas;
    out.ready = d.ready_replicas;
    out.changing = d.observed_generation < d.generation || d.replicas != d.spec_replicas;
    return out;
  }

  absl::Status Scale(PoolRole pool, int64_t replicas, const std::vector<WorkerSample>& workers,
                     absl::Time deadline) override {
    if (replicas < 0 || replicas > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot scale to ", replicas, " replicas"));
    }
    ASSIGN_OR_RETURN(const std::string deployment, Deployment(pool));
    const std::string path = DeploymentPath(deployment) + "/scale";
    int64_t current = -1;
    for (int attempt = 0;; ++attempt) {
      ASSIGN_OR_RETURN(const std::string body, client_->Call({"GET", path, "", "", ""}, deadline));
      ASSIGN_OR_RETURN(const ScaleState scale, ParseScale(body));
      if (attempt == 0) {
        current = scale.spec_replicas;
        if (replicas == current) return absl::OkStatus();
        if (replicas < current) RETURN_IF_ERROR(SetDeletionCosts(pool, workers, deadline));
      } else if (scale.spec_replicas != current) {
        return absl::AbortedError(absl::StrCat(
            "Deployment ", deployment, " was scaled from ", current, " to ", scale.spec_replicas,
            " by someone else while the planner scaled it to ", replicas));
      }
      const absl::Status patched =
          client_
              ->Call({"PATCH", path, "", kMergePatch, ScalePatch(replicas, scale.resource_version)},
                     deadline)
              .status();
      if (patched.ok()) {
        LOG(INFO) << "kubernetes: Deployment " << deployment << " scaled from " << current << " to "
                  << replicas << " replicas";
        return absl::OkStatus();
      }
      if (patched.code() != absl::StatusCode::kAborted || attempt >= options_.conflict_retries) {
        return patched;
      }
      LOG(INFO) << "kubernetes: " << patched.message() << "; reading the scale again";
    }
  }

 private:
  absl::StatusOr<std::string> Deployment(PoolRole pool) const {
    const std::string& name = options_.deployments[static_cast<int>(pool)];
    if (name.empty()) {
      return absl::NotFoundError(
          absl::StrCat("no Deployment is configured for the ", PoolRoleName(pool), " pool"));
    }
    return name;
  }

  std::string DeploymentPath(const std::string& name) const {
    return absl::StrCat("/apis/apps/v1/namespaces/", options_.namespace_name, "/deployments/",
                        name);
  }

  // Sets every pool pod's pod-deletion-cost from its worker's load (pod_deletion_cost.h).
  absl::Status SetDeletionCosts(PoolRole pool, const std::vector<WorkerSample>& workers,
                                absl::Time deadline) {
    const std::string pods_path =
        absl::StrCat("/api/v1/namespaces/", options_.namespace_name, "/pods");
    const std::string query =
        absl::StrCat("labelSelector=", QueryEscape(options_.pod_selectors[static_cast<int>(pool)]));
    ASSIGN_OR_RETURN(const std::string body,
                     client_->Call({"GET", pods_path, query, "", ""}, deadline));
    ASSIGN_OR_RETURN(const std::vector<PodState> pods, ParsePodList(body));
    std::vector<std::string> ips;
    ips.reserve(pods.size());
    for (const PodState& pod : pods) ips.push_back(pod.ip);
    const std::vector<int32_t> costs = PodDeletionCosts(ips, workers);
    std::vector<std::string> set;
    for (size_t i = 0; i < pods.size(); ++i) {
      const std::string cost = std::to_string(costs[i]);
      if (pods[i].deleting || pods[i].deletion_cost == cost) continue;
      const absl::Status patched = client_
                                       ->Call({"PATCH", absl::StrCat(pods_path, "/", pods[i].name),
                                               "", kMergePatch, PodDeletionCostPatch(costs[i])},
                                              deadline)
                                       .status();
      if (absl::IsNotFound(patched)) continue;  // deleted since the list
      RETURN_IF_ERROR(patched);
      set.push_back(absl::StrCat(pods[i].name, "=", cost));
    }
    if (!set.empty()) {
      LOG(INFO) << "kubernetes: " << kPodDeletionCostAnnotation << " of the " << PoolRoleName(pool)
                << " pool: " << absl::StrJoin(set, " ");
    }
    return absl::OkStatus();
  }

  const KubernetesActuatorOptions options_;
  const std::unique_ptr<KubernetesClient> client_;
};

absl::StatusOr<std::string> ReadNamespace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
  std::stringstream content;
  content << in.rdbuf();
  std::string ns(absl::StripAsciiWhitespace(content.str()));
  if (ns.empty()) return absl::FailedPreconditionError(absl::StrCat(path, " is empty"));
  return ns;
}

// A DNS label (RFC 1123), what a namespace or a Deployment's name is.
bool IsDnsName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  for (const char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-' || c == '.')) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> InClusterApiServer(absl::string_view host, absl::string_view port) {
  if (host.empty() || port.empty()) {
    return absl::FailedPreconditionError(
        "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod): name "
        "the API server");
  }
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return absl::FailedPreconditionError(
        absl::StrCat("KUBERNETES_SERVICE_PORT '", port, "' is not a port"));
  }
  return absl::StrCat("https://", JoinHostPort(host, number));
}

absl::StatusOr<std::unique_ptr<Actuator>> NewKubernetesActuator(KubernetesActuatorOptions options) {
  if (options.api_server.empty()) {
    const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    ASSIGN_OR_RETURN(options.api_server, InClusterApiServer(host ? host : "", port ? port : ""));
  }
  if (options.namespace_name.empty()) {
    ASSIGN_OR_RETURN(options.namespace_name, ReadNamespace(options.namespace_file));
  }
  if (!IsDnsName(options.namespace_name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", options.namespace_name, "' is not a namespace name"));
  }
  for (int i = 0; i < kPoolRoles; ++i) {
    const std::string& deployment = options.deployments[i];
    if (deployment.empty()) continue;
    const char* pool = PoolRoleName(static_cast<PoolRole>(i));
    if (!IsDnsName(deployment)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", deployment, "' (the ", pool, " pool) is not a Deployment name"));
    }
    if (options.pod_selectors[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the ", pool, " pool's Deployment ", deployment, " has no pod selector"));
    }
  }
  if (options.conflict_retries < 0) {
    return absl::InvalidArgumentError("conflict_retries must not be negative");
  }
  KubernetesClientOptions client;
  client.server = options.api_server;
  client.token_file = options.token_file;
  client.ca_file = options.ca_file;
  client.max_response_bytes = options.max_response_bytes;
  ASSIGN_OR_RETURN(std::unique_ptr<KubernetesClient> c, KubernetesClient::Create(client));
  return std::unique_ptr<Actuator>(new KubernetesActuator(std::move(options), std::move(c)));
}

}  // namespace ferry
