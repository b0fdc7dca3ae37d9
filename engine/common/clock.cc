#include "engine/common/clock.h"

#include <time.h>

#include "absl/time/clock.h"

namespace ferry {
namespace {

class RealClockImpl : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }

  absl::Duration Monotonic() const override {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return absl::DurationFromTimespec(ts);
  }

  void SleepFor(absl::Duration duration) override { absl::SleepFor(duration); }
};

}  // namespace

Clock& RealClock() {
  static Clock* const clock = new RealClockImpl();
  return *clock;
}

std::unique_ptr<Clock> NewRealClock() { return std::make_unique<RealClockImpl>(); }

}  // namespace ferry
