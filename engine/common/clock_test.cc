#include "engine/common/clock.h"

#include <atomic>
#include <thread>

#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(RealClockTest, MonotonicNeverGoesBack) {
  Clock& clock = RealClock();
  absl::Duration last = clock.Monotonic();
  for (int i = 0; i < 1000; ++i) {
    const absl::Duration now = clock.Monotonic();
    EXPECT_GE(now, last);
    last = now;
  }
  EXPECT_GT(clock.Now(), absl::FromUnixSeconds(1'600'000'000));
}

TEST(FakeClockTest, AdvanceMovesBothClocks) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1000));
  EXPECT_EQ(clock.Monotonic(), absl::ZeroDuration());
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(1005));
  EXPECT_EQ(clock.Monotonic(), absl::Seconds(5));
}

TEST(FakeClockTest, WallStepDoesNotMoveMonotonic) {
  FakeClock clock(absl::FromUnixSeconds(1000));
  clock.SetWallTime(absl::FromUnixSeconds(10));
  EXPECT_EQ(clock.Now(), absl::FromUnixSeconds(10));
  EXPECT_EQ(clock.Monotonic(), absl::ZeroDuration());
}

TEST(FakeClockTest, SleepersWakeOnlyWhenTheirTimeComes) {
  FakeClock clock;
  std::atomic<bool> woke{false};
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    woke = true;
  });
  clock.WaitForSleepers(1);
  clock.Advance(absl::Seconds(9));
  EXPECT_FALSE(woke.load());
  EXPECT_EQ(clock.sleepers(), 1);
  clock.Advance(absl::Seconds(1));
  sleeper.join();
  EXPECT_TRUE(woke.load());
  EXPECT_EQ(clock.sleepers(), 0);
}

TEST(FakeClockTest, ZeroSleepReturnsAtOnce) {
  FakeClock clock;
  clock.SleepFor(absl::ZeroDuration());
  EXPECT_EQ(clock.sleepers(), 0);
}

TEST(FakeClockDeathTest, TimeOnlyMovesForward) {
  FakeClock clock;
  EXPECT_DEATH(clock.Advance(absl::Seconds(-1)), "time only moves forward");
}

}  // namespace
}  // namespace ferry
