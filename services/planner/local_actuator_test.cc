#include "services/planner/local_actuator.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "services/planner/actuator_factory.h"

namespace ferry {
namespace {

// A stack's state directory with an order file, and testdata/fake_ferry.sh as the script: it
// records each call in STATE/calls and exits when the test writes "STATUS MESSAGE" to STATE/go.
class LocalActuatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/state-",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(mkdir(state_.c_str(), 0755), 0);
    ASSERT_EQ(mkfifo((state_ + "/go").c_str(), 0600), 0);
    WriteOrder("kvstore\nprefill0\ndecode0\ndecode1\nrouter\n");
    options_.ferry_script = "services/planner/testdata/fake_ferry.sh";
    options_.state_dir = state_;
    options_.output_file = state_ + "/out.log";
    options_.grace = absl::Seconds(7);
  }

  void WriteOrder(const std::string& text) { std::ofstream(state_ + "/order") << text; }

  // Lets the running fake end (blocks until it reads, so it has started).
  void Finish(int status, const std::string& message) {
    std::ofstream(state_ + "/go") << status << " " << message << "\n";
  }

  std::string Calls() {
    std::ifstream in(state_ + "/calls");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  std::unique_ptr<LocalActuator> Make() {
    auto actuator = LocalActuator::Create(options_);
    EXPECT_TRUE(actuator.ok()) << actuator.status();
    return std::move(*actuator);
  }

  std::string state_;
  LocalActuatorOptions options_;
};

TEST_F(LocalActuatorTest, CountsThePoolsFromTheStacksRecord) {
  auto actuator = Make();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto decode = actuator->Replicas(PoolRole::kDecode, deadline);
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->spec, 2);
  EXPECT_EQ(decode->ready, 2);
  EXPECT_FALSE(decode->changing);
  EXPECT_EQ(actuator->Replicas(PoolRole::kPrefill, deadline)->spec, 1);
  EXPECT_EQ(actuator->Replicas(PoolRole::kAggregated, deadline).status().code(),
            absl::StatusCode::kNotFound);
  // The aggregated pool is the script's "worker".
  WriteOrder("kvstore\nworker0\nworker1\nworker2\nrouter\n");
  EXPECT_EQ(actuator->Replicas(PoolRole::kAggregated, deadline)->spec, 3);
  unlink((state_ + "/order").c_str());
  EXPECT_EQ(actuator->Replicas(PoolRole::kDecode, deadline).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Calls().empty());  // reading never runs the script
}

TEST_F(LocalActuatorTest, ScalesInTheBackgroundOneAtATime) {
  auto actuator = Make();
  // The planner blocks the termination signals for its sigwait thread, and holds descriptors
  // (its admin listener) that must not leak into the workers a scale starts.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old), 0);
  const int leaked = open("/dev/null", O_RDONLY);  // no O_CLOEXEC
  ASSERT_GE(leaked, 3);
  setenv("FAKE_LEAKED_FD", std::to_string(leaked).c_str(), 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE(actuator->Scale(PoolRole::kDecode, 3, {}, deadline).ok());
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(leaked);

  // While it runs: the target, the ready ones, and every pool changing; no second scale.
  auto decode = actuator->Replicas(PoolRole::kDecode, deadline);
  ASSERT_TRUE(decode.ok());
  EXPECT_EQ(decode->spec, 3);
  EXPECT_EQ(decode->ready, 2);
  EXPECT_TRUE(decode->changing);
  auto prefill = actuator->Replicas(PoolRole::kPrefill, deadline);
  ASSERT_TRUE(prefill.ok());
  EXPECT_EQ(prefill->spec, 1);
  EXPECT_TRUE(prefill->changing);
  EXPECT_EQ(actuator->Scale(PoolRole::kPrefill, 2, {}, deadline).code(),
            absl::StatusCode::kUnavailable);

  Finish(0, "fine");
  ASSERT_TRUE(actuator->WaitIdle(absl::Now() + absl::Seconds(30)));
  const std::string calls = Calls();
  EXPECT_NE(calls.find(absl::StrCat("scale decode 3 --grace 7s | FERRY_STATE=", state_)),
            std::string::npos)
      << calls;
  EXPECT_NE(calls.find("blocked=0000000000000000"), std::string::npos) << calls;
  EXPECT_NE(calls.find("leaked=no"), std::string::npos) << calls;
  EXPECT_NE(calls.find("leader=yes"), std::string::npos) << calls;
  // Done: the stack's record counts again (the real script updates it; here it did not).
  decode = actuator->Replicas(PoolRole::kDecode, deadline);
  ASSERT_TRUE(decode.ok()) << decode.status();
  EXPECT_EQ(decode->spec, 2);
  EXPECT_FALSE(decode->changing);
}

TEST_F(LocalActuatorTest, AFailedScaleIsReportedOnceWithTheScriptsWords) {
  auto actuator = Make();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE(actuator->Scale(PoolRole::kDecode, 1, {}, deadline).ok());
  Finish(3, "scale: another ./ferry scale is running on this stack");
  ASSERT_TRUE(actuator->WaitIdle(absl::Now() + absl::Seconds(30)));
  // The other pools hear nothing of it.
  EXPECT_TRUE(actuator->Replicas(PoolRole::kPrefill, deadline).ok());
  auto failed = actuator->Replicas(PoolRole::kDecode, deadline);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal);
  const std::string message(failed.status().message());
  EXPECT_NE(message.find("./ferry scale decode 1 exited 3"), std::string::npos) << message;
  EXPECT_NE(message.find("ferry: error: scale: another ./ferry scale is running on this stack"),
            std::string::npos)
      << message;  // without the colour codes
  EXPECT_EQ(message.find('\033'), std::string::npos) << message;
  EXPECT_TRUE(actuator->Replicas(PoolRole::kDecode, deadline).ok());  // once
}

TEST_F(LocalActuatorTest, AScalePastItsDeadlineIsReportedAndLeftToFinish) {
  options_.grace = absl::Seconds(1);
  options_.script_wait = absl::ZeroDuration();
  options_.margin = absl::ZeroDuration();
  auto actuator = Make();
  ASSERT_TRUE(actuator->Scale(PoolRole::kDecode, 1, {}, absl::Now()).ok());
  // Its deadline is 1 s away; it waits for the test's word longer than that.
  EXPECT_FALSE(actuator->WaitIdle(absl::Now() + absl::Milliseconds(1500)));
  auto overdue = actuator->Replicas(PoolRole::kDecode, absl::Now());
  EXPECT_EQ(overdue.status().code(), absl::StatusCode::kDeadlineExceeded) << overdue.status();
  auto still = actuator->Replicas(PoolRole::kDecode, absl::Now());
  ASSERT_TRUE(still.ok());
  EXPECT_TRUE(still->changing);
  Finish(0, "late");
  EXPECT_TRUE(actuator->WaitIdle(absl::Now() + absl::Seconds(30)));
}

TEST_F(LocalActuatorTest, RefusesWhatTheScriptWouldRefuse) {
  auto actuator = Make();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  EXPECT_EQ(actuator->Scale(PoolRole::kDecode, 0, {}, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(actuator->Scale(PoolRole::kDecode, 50, {}, deadline).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(actuator->Scale(PoolRole::kAggregated, 2, {}, deadline).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(actuator->Scale(PoolRole::kDecode, 2, {}, deadline).ok());  // has 2: nothing to do
  EXPECT_FALSE(actuator->Replicas(PoolRole::kDecode, deadline)->changing);
  EXPECT_TRUE(Calls().empty());
}

TEST_F(LocalActuatorTest, TheFactoryBuildsEachByName) {
  ActuatorConfig config;
  config.local = options_;
  for (const char* name : {"local", "advice"}) {
    config.name = name;
    auto actuator = NewActuator(config);
    ASSERT_TRUE(actuator.ok()) << actuator.status();
    EXPECT_STREQ((*actuator)->name(), name);
  }
  config.name = "kubernetes";
  EXPECT_EQ(NewActuator(config).status().code(), absl::StatusCode::kUnimplemented);
  config.name = "helm";
  EXPECT_EQ(NewActuator(config).status().code(), absl::StatusCode::kInvalidArgument);
  config.name = "local";
  config.local.ferry_script = "/nonexistent/ferry";
  EXPECT_FALSE(NewActuator(config).ok());
  config.local = options_;
  config.local.state_dir = "";
  EXPECT_EQ(NewActuator(config).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
