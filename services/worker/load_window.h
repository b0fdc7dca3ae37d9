// The worker's measured speed over a recent window of engine steps (ARCHITECTURE.md §6: the
// router's cost model divides by *measured* throughput, so a slow or throttled worker gets less
// work): the engine thread records every step (EngineOptions::on_step), readers get the mean
// step time, the prefill speed (prompt tokens per second of the steps that computed prompt
// tokens) and the decode throughput (decoded tokens per second of the steps that decoded).
//
// And the busy fraction (a planner's input for prefill pools): the engine's step time over the
// wall time of the window (or of the worker's life, while shorter than the window), in [0, 1].
// A decode worker is ~1 whenever anything decodes, so its load is measured against capacity
// instead (worker_metrics.h: KV used, running over max_running).
//
// Bounded: steps older than the window are dropped, and at most kMaxSteps are kept.
//
// Thread-safe.

#ifndef FERRY_SERVICES_WORKER_LOAD_WINDOW_H_
#define FERRY_SERVICES_WORKER_LOAD_WINDOW_H_

#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "engine/engine.h"

namespace ferry {

struct LoadSummary {
  int64_t steps = 0;
  double step_seconds = 0;               // mean
  double prefill_tokens_per_second = 0;  // 0 without prefill steps in the window
  double decode_tokens_per_second = 0;
  double busy_fraction = 0;  // step time over wall time, in [0, 1]
};

class LoadWindow {
 public:
  static constexpr size_t kMaxSteps = 1 << 16;
  // `clock` (Monotonic) must outlive the window.
  explicit LoadWindow(absl::Duration window, Clock* clock = &RealClock())
      : window_(window), clock_(clock), created_(clock->Monotonic()) {}

  // A step that just ended.
  void Record(const StepInfo& step);
  LoadSummary Summary();
  double window_seconds() const { return absl::ToDoubleSeconds(window_); }

 private:
  struct Entry {
    absl::Duration at;  // Monotonic() when it was recorded
    StepInfo step;
  };
  void Trim(absl::Duration now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration window_;
  Clock* const clock_;
  const absl::Duration created_;
  absl::Mutex mu_;
  std::deque<Entry> steps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_LOAD_WINDOW_H_
