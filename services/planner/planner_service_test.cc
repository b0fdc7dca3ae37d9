#include "services/planner/planner_service.h"

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/common/admin_server.h"
#include "services/common/http_get.h"
#include "services/planner/advice_actuator.h"

namespace ferry {
namespace {

std::string Testdata(const std::string& name) {
  std::ifstream in("services/planner/testdata/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A router's admin port serving recorded pages (a P/D stack: 2 decode, 1 prefill worker).
class FakeRouter {
 public:
  FakeRouter() {
    AdminServerOptions options;
    options.routes = [this](const std::string& method, const std::string& path, const std::string&,
                            AdminReply* reply) {
      if (method != "GET") return false;
      if (path == "/workers") reply->body = workers_;
      if (path == "/metrics") reply->body = metrics_;
      return path == "/workers" || path == "/metrics";
    };
    auto server = AdminServer::Start(options, nullptr);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", server_->port()); }

 private:
  const std::string workers_ = Testdata("workers_pd_under_load.json");
  const std::string metrics_ = Testdata("metrics_pd_under_load.txt");
  std::unique_ptr<AdminServer> server_;
};

// Records what it is asked; answers with `scale_status`.
class FakeActuator : public Actuator {
 public:
  struct Call {
    PoolRole pool;
    int64_t replicas;
    size_t workers;
  };
  FakeActuator(std::vector<Call>* calls, absl::Status* scale_status, bool* changing)
      : calls_(calls), scale_status_(scale_status), changing_(changing) {}
  const char* name() const override { return "fake"; }
  absl::StatusOr<PoolReplicas> Replicas(PoolRole pool, absl::Time) override {
    if (pool == PoolRole::kAggregated) return absl::NotFoundError("no such pool");
    PoolReplicas r;
    r.spec = pool == PoolRole::kDecode ? 3 : 1;  // one decode replica still starting
    r.ready = pool == PoolRole::kDecode ? 2 : 1;
    r.changing = *changing_;
    return r;
  }
  absl::Status Scale(PoolRole pool, int64_t replicas, const std::vector<WorkerSample>& workers,
                     absl::Time) override {
    calls_->push_back({pool, replicas, workers.size()});
    return *scale_status_;
  }

 private:
  std::vector<Call>* calls_;
  absl::Status* scale_status_;
  bool* changing_;
};

class PlannerServiceTest : public ::testing::Test {
 protected:
  std::unique_ptr<PlannerService> Start(std::vector<std::string> routers) {
    PlannerServiceOptions options;
    options.reader.routers = std::move(routers);
    options.reader.timeout = absl::Seconds(5);
    options.run_loop = false;
    auto service = PlannerService::Start(
        options, std::make_unique<FakeActuator>(&calls_, &scale_status_, &changing_));
    EXPECT_TRUE(service.ok()) << service.status();
    return std::move(*service);
  }

  std::string Get(const PlannerService& service, const std::string& path) {
    auto body = HttpGet(absl::StrCat("127.0.0.1:", service.admin_port()), path,
                        absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(body.ok() || path == "/readyz") << body.status();
    return body.ok() ? *body : body.status().ToString();
  }

  // The value of the sample `line` starts ("name{labels}") on the service's metrics page.
  double Metric(const PlannerService& service, const std::string& line) {
    const std::string page = Get(service, "/metrics");
    const size_t at = page.find("\n" + line + " ");
    if (at == std::string::npos) return -1;
    return std::stod(page.substr(at + line.size() + 2));
  }

  static PoolDecision Decision(PoolRole pool, PlanAction action, int64_t current, int64_t desired,
                               int64_t needed, const std::string& reason) {
    PoolDecision d;
    d.pool = pool;
    d.action = action;
    d.current = current;
    d.desired = desired;
    d.needed = needed;
    d.reason = reason;
    d.detail = "a test's decision";
    d.utilisation = 0.5;
    d.ready = current;
    return d;
  }

  std::vector<FakeActuator::Call> calls_;
  absl::Status scale_status_;
  bool changing_ = false;
};

TEST_F(PlannerServiceTest, ARoundReadsTheRoutersAndTheActuator) {
  FakeRouter router;
  auto service = Start({router.address()});
  EXPECT_NE(Get(*service, "/readyz").find("503"), std::string::npos);  // no round yet
  service->RunRound();
  EXPECT_EQ(Get(*service, "/readyz"), "ready\n");
  EXPECT_EQ(Metric(*service, "ferry_planner_routers"), 1);
  EXPECT_EQ(Metric(*service, "ferry_planner_snapshot_errors_total"), 0);
  const nlohmann::json plan = nlohmann::json::parse(Get(*service, "/plan"));
  EXPECT_EQ(plan["last"]["routers"], 1);
  EXPECT_EQ(plan["last"]["actuator"], "fake");
  EXPECT_TRUE(plan["last"]["router_errors"].empty());
  EXPECT_TRUE(plan["recent"].is_array());
}

TEST_F(PlannerServiceTest, ARouterThatDoesNotAnswerIsCountedAndMakesItNotReady) {
  // A port nothing listens on (the admin server of a service stopped at once).
  std::string gone;
  {
    auto stopped = AdminServer::Start({}, nullptr);
    ASSERT_TRUE(stopped.ok());
    gone = absl::StrCat("127.0.0.1:", (*stopped)->port());
  }
  auto service = Start({gone});
  service->RunRound();
  service->RunRound();
  EXPECT_EQ(Metric(*service, "ferry_planner_snapshot_errors_total"), 2);
  EXPECT_EQ(Metric(*service, "ferry_planner_routers"), 0);
  EXPECT_NE(Get(*service, "/readyz").find("503"), std::string::npos);
  const nlohmann::json plan = nlohmann::json::parse(Get(*service, "/plan"));
  ASSERT_EQ(plan["last"]["router_errors"].size(), 1u);
  EXPECT_EQ(plan["last"]["router_errors"][0]["router"], gone);
}

TEST_F(PlannerServiceTest, AChangeIsAskedOfTheActuatorCountedAndShown) {
  FakeRouter router;
  auto service = Start({router.address()});
  Snapshot snapshot;
  snapshot.pool(PoolRole::kDecode).workers.resize(2);
  Plan plan;
  plan.time_s = 42;
  plan.pools = {Decision(PoolRole::kDecode, PlanAction::kScaleOut, 2, 3, 3, "load"),
                Decision(PoolRole::kPrefill, PlanAction::kHold, 1, 1, 1, "steady")};
  service->ApplyPlan(plan, snapshot);
  ASSERT_EQ(calls_.size(), 1u);
  EXPECT_EQ(calls_[0].pool, PoolRole::kDecode);
  EXPECT_EQ(calls_[0].replicas, 3);
  EXPECT_EQ(calls_[0].workers, 2u);  // the pool's workers, for the actuator's choice
  EXPECT_EQ(Metric(*service, "ferry_planner_desired_replicas{pool=\"decode\"}"), 3);
  EXPECT_EQ(Metric(*service, "ferry_planner_desired_replicas{pool=\"prefill\"}"), 1);
  EXPECT_EQ(Metric(*service,
                   "ferry_planner_decisions_total{action=\"scale_out\",pool=\"decode\",reason="
                   "\"load\"}"),
            1);
  EXPECT_EQ(Metric(*service, "ferry_planner_replicas{pool=\"decode\",state=\"ready\"}"), 2);
  EXPECT_EQ(Metric(*service, "ferry_planner_utilisation{pool=\"decode\"}"), 0.5);
  const nlohmann::json got = nlohmann::json::parse(Get(*service, "/plan"));
  ASSERT_EQ(got["last"]["pools"].size(), 2u);
  EXPECT_EQ(got["last"]["pools"][0]["actuation"], "asked");
  EXPECT_EQ(got["last"]["pools"][1]["actuation"], "none");
  ASSERT_EQ(got["recent"].size(), 1u);  // the change; a hold that blocks nothing is not recent
  EXPECT_EQ(got["recent"][0]["pool"], "decode");
  EXPECT_EQ(got["recent"][0]["time_s"], 42);
  EXPECT_EQ(got["recent"][0]["desired"], 3);
}

TEST_F(PlannerServiceTest, ABlockedScaleInIsCountedByReason) {
  FakeRouter router;
  auto service = Start({router.address()});
  Plan plan;
  plan.pools = {
      Decision(PoolRole::kDecode, PlanAction::kHold, 3, 3, 1, "utilisation_above_0.8"),
      Decision(PoolRole::kPrefill, PlanAction::kHold, 2, 2, 1, "cooldown"),
  };
  service->ApplyPlan(plan, Snapshot());
  service->ApplyPlan(plan, Snapshot());
  EXPECT_TRUE(calls_.empty());
  EXPECT_EQ(Metric(*service,
                   "ferry_planner_scale_in_blocked_total{pool=\"decode\",reason=\"utilisation_"
                   "above_0.8\"}"),
            2);
  EXPECT_EQ(Metric(*service,
                   "ferry_planner_scale_in_blocked_total{pool=\"prefill\",reason=\"cooldown\"}"),
            2);
  const nlohmann::json got = nlohmann::json::parse(Get(*service, "/plan"));
  EXPECT_EQ(got["recent"].size(), 4u);
  EXPECT_TRUE(got["last"]["pools"][0]["blocked_scale_in"].get<bool>());
}

TEST_F(PlannerServiceTest, ABusyActuatorDefersAndAFailingOneCounts) {
  FakeRouter router;
  auto service = Start({router.address()});
  Plan plan;
  plan.pools = {Decision(PoolRole::kDecode, PlanAction::kScaleIn, 3, 2, 2, "load")};
  scale_status_ = absl::UnavailableError("another scale runs");
  service->ApplyPlan(plan, Snapshot());
  EXPECT_EQ(Metric(*service, "ferry_planner_actuator_errors_total{pool=\"decode\"}"), 0);
  nlohmann::json got = nlohmann::json::parse(Get(*service, "/plan"));
  EXPECT_EQ(got["last"]["pools"][0]["actuation"], "deferred: another scale runs");
  scale_status_ = absl::PermissionDeniedError("forbidden");
  service->ApplyPlan(plan, Snapshot());
  EXPECT_EQ(Metric(*service, "ferry_planner_actuator_errors_total{pool=\"decode\"}"), 1);
  got = nlohmann::json::parse(Get(*service, "/plan"));
  EXPECT_NE(got["last"]["pools"][0]["actuation"].get<std::string>().find("forbidden"),
            std::string::npos);
  EXPECT_EQ(calls_.size(), 2u);
  // The actuator says the pool is still changing: not asked at all.
  changing_ = true;
  service->RunRound();
  service->ApplyPlan(plan, Snapshot());
  EXPECT_EQ(calls_.size(), 2u);
  got = nlohmann::json::parse(Get(*service, "/plan"));
  EXPECT_EQ(got["last"]["pools"][0]["actuation"],
            "deferred: the actuator is still changing a pool");
}

TEST_F(PlannerServiceTest, TheAdviceActuatorChangesNothingAndKeepsTheAdvice) {
  AdviceActuator advice;
  EXPECT_EQ(advice.Replicas(PoolRole::kDecode, absl::Now())->spec, -1);
  EXPECT_TRUE(advice.Scale(PoolRole::kDecode, 4, {}, absl::Now()).ok());
  EXPECT_EQ(advice.advice(PoolRole::kDecode), 4);
  EXPECT_EQ(advice.advice(PoolRole::kPrefill), -1);
  EXPECT_FALSE(advice.Scale(PoolRole::kDecode, -1, {}, absl::Now()).ok());
}

TEST_F(PlannerServiceTest, RefusesBadOptions) {
  PlannerServiceOptions options;
  EXPECT_FALSE(options.Validate().ok());  // no router
  options.reader.routers = {"127.0.0.1:1"};
  EXPECT_TRUE(options.Validate().ok());
  options.planner.interval_s = 0;
  EXPECT_FALSE(options.Validate().ok());
  options.planner.interval_s = 10;
  EXPECT_FALSE(PlannerService::Start(options, nullptr).ok());
}

}  // namespace
}  // namespace ferry
