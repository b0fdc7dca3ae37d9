#include "services/planner/kubernetes_objects.h"

#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

TEST(ParseDeployment, ReadsSpecAndStatus) {
  const auto d = ParseDeployment(R"({"apiVersion":"apps/v1","kind":"Deployment",
      "metadata":{"name":"ferry-decode","generation":7},
      "spec":{"replicas":4},
      "status":{"replicas":5,"readyReplicas":3,"observedGeneration":6}})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->spec_replicas, 4);
  EXPECT_EQ(d->replicas, 5);
  EXPECT_EQ(d->ready_replicas, 3);
  EXPECT_EQ(d->generation, 7);
  EXPECT_EQ(d->observed_generation, 6);
}

TEST(ParseDeployment, AbsentStatusFieldsAreZero) {
  // The API server omits zero counts; spec.replicas is defaulted to 1.
  const auto d = ParseDeployment(R"({"kind":"Deployment","spec":{},"status":{}})");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->spec_replicas, 1);
  EXPECT_EQ(d->ready_replicas, 0);
  EXPECT_EQ(d->replicas, 0);
}

TEST(ParseDeployment, RejectsWhatIsNotADeployment) {
  for (const char* body : {
           "",
           "not json",
           "[1,2]",
           R"({"spec":{"replicas":"three"}})",
           R"({"spec":{"replicas":-1}})",
           R"({"spec":{"replicas":2.5}})",
           R"({"status":{"readyReplicas":true}})",
           R"({"kind":"Scale","spec":{"replicas":2}})",
           R"({"spec":{"replicas":2})",
       }) {
    const auto d = ParseDeployment(body);
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
  EXPECT_THAT(std::string(ParseDeployment(R"({"spec":{"replicas":"x"}})").status().message()),
              HasSubstr("spec.replicas"));
}

TEST(ParseScale, ReadsReplicasAndResourceVersion) {
  const auto s = ParseScale(R"({"kind":"Scale","apiVersion":"autoscaling/v1",
      "metadata":{"name":"ferry-decode","resourceVersion":"4711"},
      "spec":{"replicas":3},"status":{"replicas":3,"selector":"a=b"}})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->spec_replicas, 3);
  EXPECT_EQ(s->resource_version, "4711");
  // A Deployment scaled to zero: spec.replicas omitted.
  const auto zero = ParseScale(R"({"kind":"Scale","spec":{}})");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->spec_replicas, 0);
  EXPECT_EQ(zero->resource_version, "");
  EXPECT_FALSE(ParseScale(R"({"metadata":{"resourceVersion":12}})").ok());
  EXPECT_FALSE(ParseScale(R"({"kind":"Deployment"})").ok());
}

TEST(ParsePodList, ReadsNamesIpsDeletionAndCost) {
  const auto pods = ParsePodList(R"({"kind":"PodList","items":[
      {"metadata":{"name":"a","annotations":{"controller.kubernetes.io/pod-deletion-cost":"2"}},
       "status":{"podIP":"10.0.0.1"}},
      {"metadata":{"name":"b","deletionTimestamp":"2026-01-01T00:00:00Z"},
       "status":{"podIP":"10.0.0.2"}},
      {"metadata":{"name":"c"},"status":{}}]})");
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 3u);
  EXPECT_EQ((*pods)[0].name, "a");
  EXPECT_EQ((*pods)[0].ip, "10.0.0.1");
  EXPECT_EQ((*pods)[0].deletion_cost, "2");
  EXPECT_FALSE((*pods)[0].deleting);
  EXPECT_TRUE((*pods)[1].deleting);
  EXPECT_EQ((*pods)[2].ip, "");
  EXPECT_EQ((*pods)[2].deletion_cost, "");
  const auto empty = ParsePodList(R"({"kind":"PodList","items":null})");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST(ParsePodList, RejectsMalformedItems) {
  for (const char* body : {
           R"({"items":{}})",
           R"({"items":[1]})",
           R"({"items":[{"metadata":{}}]})",
           R"({"items":[{"metadata":{"name":7}}]})",
           R"({"items":[{"metadata":{"name":"a"},"status":{"podIP":[]}}]})",
           R"({"items":[{"metadata":{"name":"a","annotations":{
               "controller.kubernetes.io/pod-deletion-cost":3}}}]})",
       }) {
    EXPECT_EQ(ParsePodList(body).status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
}

TEST(Patches, AreTheExactMergePatches) {
  EXPECT_EQ(ScalePatch(3, "4711"),
            R"({"metadata":{"resourceVersion":"4711"},"spec":{"replicas":3}})");
  EXPECT_EQ(ScalePatch(0, ""), R"({"spec":{"replicas":0}})");
  EXPECT_EQ(PodDeletionCostPatch(-5),
            R"({"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"-5"}}})");
}

TEST(ApiError, CarriesTheServersMessageAndCode) {
  const absl::Status s = ApiError(403,
                                  R"({"kind":"Status","apiVersion":"v1","status":"Failure",
      "message":"deployments.apps \"ferry-decode\" is forbidden: User \"x\" cannot get",
      "reason":"Forbidden","code":403})",
                                  "GET /apis/apps/v1/namespaces/ferry/deployments/ferry-decode");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "GET /apis/apps/v1/namespaces/ferry/deployments/ferry-decode: HTTP 403: "
            "deployments.apps \"ferry-decode\" is forbidden: User \"x\" cannot get");
  EXPECT_EQ(ApiError(404, "{}", "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ApiError(409, "{}", "x").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(ApiError(401, "{}", "x").code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(ApiError(422, "{}", "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApiError(429, "{}", "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ApiError(503, "{}", "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ApiError(504, "{}", "x").code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ApiError(418, "{}", "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ApiError(500, "{}", "x").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(ApiError(302, "", "x").code(), absl::StatusCode::kInternal);
}

TEST(ApiError, QuotesABodyThatIsNoStatusSafely) {
  EXPECT_EQ(ApiError(502, "", "GET /x").message(), "GET /x: HTTP 502: (empty body)");
  EXPECT_EQ(ApiError(500, "bad\r\ngateway\x01", "GET /x").message(),
            "GET /x: HTTP 500: bad  gateway ");
  const std::string huge(100000, 'a');
  const absl::Status s = ApiError(500, huge, "GET /x");
  EXPECT_LT(s.message().size(), 300u);
  EXPECT_TRUE(absl::EndsWith(s.message(), "..."));
  const absl::Status long_message = ApiError(500, "{\"message\":\"" + huge + "\"}", "GET /x");
  EXPECT_LT(long_message.message().size(), 1100u);
}

}  // namespace
}  // namespace ferry
