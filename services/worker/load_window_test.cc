// LoadWindow on a fake clock: speeds and the busy fraction over the window, over a life shorter
// than the window, and after the steps left it.

#include "services/worker/load_window.h"

#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

StepInfo Step(double seconds, int64_t prefill, int64_t decode) {
  StepInfo s;
  s.seconds = seconds;
  s.prefill_tokens = prefill;
  s.decode_tokens = decode;
  return s;
}

TEST(LoadWindowTest, BusyFractionIsStepTimeOverWallTime) {
  FakeClock clock;
  LoadWindow window(absl::Seconds(10), &clock);
  EXPECT_EQ(window.Summary().busy_fraction, 0);  // no time has passed, no step
  // 4 s of life: 1 s of prefill steps, 1 s of decode steps.
  clock.Advance(absl::Seconds(2));
  window.Record(Step(1.0, 1000, 0));
  clock.Advance(absl::Seconds(2));
  window.Record(Step(0.5, 0, 10));
  window.Record(Step(0.5, 0, 10));
  LoadSummary s = window.Summary();
  EXPECT_DOUBLE_EQ(s.busy_fraction, 0.5);
  EXPECT_DOUBLE_EQ(s.prefill_tokens_per_second, 1000);
  EXPECT_DOUBLE_EQ(s.decode_tokens_per_second, 20);
  EXPECT_EQ(s.steps, 3);
  // Past the window's length, the window's 10 s are the denominator.
  clock.Advance(absl::Seconds(6));
  EXPECT_DOUBLE_EQ(window.Summary().busy_fraction, 0.2);
  // The prefill step (recorded at 2 s) leaves the window at 12 s, the others at 14 s.
  clock.Advance(absl::Seconds(3));
  s = window.Summary();
  EXPECT_DOUBLE_EQ(s.busy_fraction, 0.1);
  EXPECT_EQ(s.prefill_tokens_per_second, 0);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(window.Summary().busy_fraction, 0);
  EXPECT_EQ(window.Summary().steps, 0);
}

TEST(LoadWindowTest, BusyFractionNeverExceedsOne) {
  FakeClock clock;
  LoadWindow window(absl::Seconds(10), &clock);
  clock.Advance(absl::Seconds(1));
  window.Record(Step(3.0, 10, 0));  // a step longer than the life it is measured against
  EXPECT_EQ(window.Summary().busy_fraction, 1.0);
}

}  // namespace
}  // namespace ferry
