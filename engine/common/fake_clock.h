// A Clock whose time moves only when a test says so.
//
// SleepFor() blocks until another thread advances the clock past the wake-up time, so code with
// timers can be tested without real sleeps: start the code under test, Advance() the clock,
// observe. WaitForSleepers() lets a test wait until the code under test is actually asleep.

#ifndef FERRY_ENGINE_COMMON_FAKE_CLOCK_H_
#define FERRY_ENGINE_COMMON_FAKE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"

namespace ferry {

// Thread-safe.
class FakeClock : public Clock {
 public:
  // Starts at `start` (wall) and a monotonic reading of zero.
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000));

  absl::Time Now() const override;
  absl::Duration Monotonic() const override;
  void SleepFor(absl::Duration duration) override;

  // Moves both wall and monotonic time forward (a negative duration is a programmer error)
  // and wakes the sleepers whose time has come.
  void Advance(absl::Duration duration);

  // Sets the wall clock only, as an NTP step would; monotonic time does not move.
  void SetWallTime(absl::Time time);

  // Blocks until at least `count` threads are inside SleepFor().
  void WaitForSleepers(int count) const;

  int sleepers() const;

 private:
  mutable absl::Mutex mu_;
  absl::Time wall_ ABSL_GUARDED_BY(mu_);
  absl::Duration monotonic_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_FAKE_CLOCK_H_
