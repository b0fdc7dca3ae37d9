#include "tools/sim/event_loop.h"

#include <utility>

#include "engine/common/log.h"

namespace ferry {

void EventLoop::At(double time, Callback callback) {
  queue_.push(Entry{time < now_ ? now_ : time, next_order_++, std::move(callback)});
}

bool EventLoop::RunOne() {
  if (queue_.empty()) return false;
  // The callback may schedule more: take it out first.
  Entry entry = std::move(const_cast<Entry&>(queue_.top()));
  queue_.pop();
  now_ = entry.time;
  ++events_run_;
  entry.callback();
  return true;
}

void EventLoop::Run(double until, const std::function<bool()>& stop) {
  while (!queue_.empty()) {
    if (queue_.top().time > until) {
      now_ = until;
      return;
    }
    RunOne();
    if (stop && stop()) return;
  }
}

absl::Time EventLoop::Now() const { return absl::UnixEpoch() + absl::Seconds(now_); }

absl::Duration EventLoop::Monotonic() const { return absl::Seconds(now_); }

void EventLoop::SleepFor(absl::Duration) {
  LOG(FATAL) << "nothing may sleep inside the discrete-event simulation";
}

}  // namespace ferry
