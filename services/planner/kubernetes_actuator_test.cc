// The actuator's setup. Its calls against a mocked API server (exact requests, errors, TLS) are
// tests/deploy/kubernetes_actuator_contract_test.

#include "services/planner/kubernetes_actuator.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::string WriteFile(const std::string& name, const std::string& content) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  std::ofstream(path) << content;
  return path;
}

TEST(InClusterApiServer, FromTheServiceEnvironment) {
  EXPECT_EQ(*InClusterApiServer("10.96.0.1", "443"), "https://10.96.0.1:443");
  EXPECT_EQ(*InClusterApiServer("fd00:10:96::1", "443"), "https://[fd00:10:96::1]:443");
  EXPECT_EQ(InClusterApiServer("", "443").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(InClusterApiServer("10.96.0.1", "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(InClusterApiServer("10.96.0.1", "https").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

KubernetesActuatorOptions HttpOptions() {
  KubernetesActuatorOptions options;
  options.api_server = "http://127.0.0.1:6443";
  options.namespace_name = "ferry";
  return options;
}

TEST(NewKubernetesActuator, ReadsTheNamespaceFile) {
  KubernetesActuatorOptions options = HttpOptions();
  options.namespace_name = "";
  options.namespace_file = WriteFile("namespace", "ferry-prod\n");
  const auto actuator = NewKubernetesActuator(options);
  ASSERT_TRUE(actuator.ok()) << actuator.status();
  EXPECT_STREQ((*actuator)->name(), "kubernetes");
  options.namespace_file = WriteFile("no-namespace", "");
  EXPECT_EQ(NewKubernetesActuator(options).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NewKubernetesActuator, ValidatesNamesAndSelectors) {
  KubernetesActuatorOptions options = HttpOptions();
  options.namespace_name = "Ferry/../x";
  EXPECT_EQ(NewKubernetesActuator(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = HttpOptions();
  options.deployments[1] = "ferry decode";
  EXPECT_EQ(NewKubernetesActuator(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = HttpOptions();
  options.pod_selectors[1] = "";
  EXPECT_EQ(NewKubernetesActuator(options).status().code(), absl::StatusCode::kInvalidArgument);
  options = HttpOptions();
  options.api_server = "https://10.96.0.1:443";
  options.ca_file = "/nonexistent/ca.crt";
  EXPECT_EQ(NewKubernetesActuator(options).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(KubernetesActuator, AnUnmanagedPoolIsNotFoundWithoutACall) {
  const auto actuator = NewKubernetesActuator(HttpOptions());
  ASSERT_TRUE(actuator.ok()) << actuator.status();
  // No server listens at 127.0.0.1:6443 in a test's sandbox; the aggregated pool has no
  // Deployment, so no call is made.
  EXPECT_EQ(
      (*actuator)->Replicas(PoolRole::kAggregated, absl::Now() + absl::Seconds(5)).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ((*actuator)->Scale(PoolRole::kAggregated, 2, {}, absl::Now() + absl::Seconds(5)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*actuator)->Scale(PoolRole::kDecode, -1, {}, absl::Now() + absl::Seconds(5)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
