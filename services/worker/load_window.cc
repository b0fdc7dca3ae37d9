#include "services/worker/load_window.h"

#include <algorithm>

namespace ferry {

void LoadWindow::Record(const StepInfo& step) {
  const absl::Duration now = clock_->Monotonic();
  absl::MutexLock lock(&mu_);
  steps_.push_back({now, step});
  Trim(now);
}

void LoadWindow::Trim(absl::Duration now) {
  while (!steps_.empty() && (steps_.size() > kMaxSteps || now - steps_.front().at > window_)) {
    steps_.pop_front();
  }
}

LoadSummary LoadWindow::Summary() {
  const absl::Duration now = clock_->Monotonic();
  absl::MutexLock lock(&mu_);
  Trim(now);
  LoadSummary s;
  double seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  int64_t prefill = 0, decode = 0;
  for (const Entry& e : steps_) {
    seconds += e.step.seconds;
    if (e.step.prefill_tokens > 0) {
      prefill += e.step.prefill_tokens;
      prefill_seconds += e.step.seconds;
    }
    if (e.step.decode_tokens > 0) {
      decode += e.step.decode_tokens;
      decode_seconds += e.step.seconds;
    }
  }
  s.steps = static_cast<int64_t>(steps_.size());
  if (s.steps > 0) s.step_seconds = seconds / static_cast<double>(s.steps);
  if (prefill_seconds > 0)
    s.prefill_tokens_per_second = static_cast<double>(prefill) / prefill_seconds;
  if (decode_seconds > 0) s.decode_tokens_per_second = static_cast<double>(decode) / decode_seconds;
  // The wall time the kept steps fall in: the window, or the life so far while shorter, or (the
  // step cap dropped some) the time since the oldest kept step began.
  double span = absl::ToDoubleSeconds(std::min(window_, now - created_));
  if (steps_.size() == kMaxSteps) {
    span = std::min(span,
                    absl::ToDoubleSeconds(now - steps_.front().at) + steps_.front().step.seconds);
  }
  if (span > 0) s.busy_fraction = std::clamp(seconds / span, 0.0, 1.0);
  return s;
}

}  // namespace ferry
