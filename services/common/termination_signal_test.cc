#include "services/common/termination_signal.h"

#include <signal.h>
#include <unistd.h>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(TerminationSignalTest, SigtermIsDeliveredToWait) {
  auto signal = TerminationSignal::Install();
  ASSERT_TRUE(signal.ok()) << signal.status();
  EXPECT_FALSE((*signal)->triggered());
  EXPECT_EQ((*signal)->WaitFor(absl::Milliseconds(20)), -1);
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);  // blocked in this thread; the sigwait thread takes it
  EXPECT_EQ((*signal)->Wait(), SIGTERM);
  EXPECT_TRUE((*signal)->triggered());
}

TEST(TerminationSignalTest, SighupCallsTheReloadCallbackAndDoesNotTerminate) {
  auto signal = TerminationSignal::Install();
  ASSERT_TRUE(signal.ok());
  ASSERT_EQ(kill(getpid(), SIGHUP), 0);  // no callback yet: ignored, the process lives
  absl::Notification reloaded;
  (*signal)->OnHangup([&] { reloaded.Notify(); });
  ASSERT_EQ(kill(getpid(), SIGHUP), 0);
  EXPECT_TRUE(reloaded.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE((*signal)->triggered());
}

TEST(TerminationSignalTest, OnlyOneInstanceAtATime) {
  auto first = TerminationSignal::Install();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(TerminationSignal::Install().status().code(), absl::StatusCode::kFailedPrecondition);
  first->reset();
  EXPECT_TRUE(TerminationSignal::Install().ok());
}

TEST(TerminationSignalTest, TriggerWakesWaitersWithZero) {
  auto signal = TerminationSignal::Install();
  ASSERT_TRUE(signal.ok());
  (*signal)->Trigger();
  (*signal)->Trigger();  // twice is fine
  EXPECT_EQ((*signal)->Wait(), 0);
  EXPECT_EQ((*signal)->WaitFor(absl::ZeroDuration()), 0);
}

TEST(TerminationSignalDeathTest, SecondSignalExitsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        auto signal = TerminationSignal::Install();
        kill(getpid(), SIGINT);
        (*signal)->Wait();
        kill(getpid(), SIGINT);
        sleep(10);  // the sigwait thread exits the process first
      },
      ::testing::ExitedWithCode(128 + SIGINT), "second termination signal");
}

}  // namespace
}  // namespace ferry
