#include "engine/common/fake_clock.h"

#include "engine/common/log.h"

namespace ferry {

FakeClock::FakeClock(absl::Time start) : wall_(start), monotonic_(absl::ZeroDuration()) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return wall_;
}

absl::Duration FakeClock::Monotonic() const {
  absl::MutexLock lock(&mu_);
  return monotonic_;
}

void FakeClock::SleepFor(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  const absl::Duration wake = monotonic_ + duration;
  ++sleepers_;
  auto woken = [this, wake]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return monotonic_ >= wake; };
  mu_.Await(absl::Condition(&woken));
  --sleepers_;
}

void FakeClock::Advance(absl::Duration duration) {
  CHECK(duration >= absl::ZeroDuration()) << "time only moves forward: " << duration;
  absl::MutexLock lock(&mu_);
  wall_ += duration;
  monotonic_ += duration;
}

void FakeClock::SetWallTime(absl::Time time) {
  absl::MutexLock lock(&mu_);
  wall_ = time;
}

void FakeClock::WaitForSleepers(int count) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return sleepers_ >= count; };
  mu_.Await(absl::Condition(&enough));
}

int FakeClock::sleepers() const {
  absl::MutexLock lock(&mu_);
  return sleepers_;
}

}  // namespace ferry
