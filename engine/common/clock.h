// The Clock seam: every component that reads time or sleeps takes a Clock, so tests can
// drive time by hand (FakeClock in fake_clock.h) instead of sleeping and hoping.
//
// Two notions of time: Now() is wall-clock time (timestamps in logs, headers, retention), and
// Monotonic() never goes backwards (deadlines, latencies, TTLs inside one process).

#ifndef FERRY_ENGINE_COMMON_CLOCK_H_
#define FERRY_ENGINE_COMMON_CLOCK_H_

#include <memory>

#include "absl/time/time.h"

namespace ferry {

// Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;

  // Wall-clock time.
  virtual absl::Time Now() const = 0;

  // Time since an arbitrary fixed point; only differences are meaningful.
  virtual absl::Duration Monotonic() const = 0;

  // Blocks the calling thread until Monotonic() has advanced by at least `duration`.
  virtual void SleepFor(absl::Duration duration) = 0;
};

// The process's real clock (absl::Now and CLOCK_MONOTONIC). Never destroyed.
Clock& RealClock();

std::unique_ptr<Clock> NewRealClock();

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_CLOCK_H_
