// The worker's measured speed over a recent window of engine steps (ARCHITECTURE.md §6: the
// router's cost model divides by *measured* throughput, so a slow or throttled worker gets less
// work): the engine thread records every step (EngineOptions::on_step), readers get the mean
// step time, the prefill speed (prompt tokens per second of the steps that computed prompt
// tokens) and the decode throughput (decoded tokens per second of the steps that decoded).
//
// Bounded: steps older than the window are dropped, and at most kMaxSteps are kept.
//
// Thread-safe.

#ifndef FERRY_SERVICES_WORKER_LOAD_WINDOW_H_
#define FERRY_SERVICES_WORKER_LOAD_WINDOW_H_

#include <chrono>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"

namespace ferry {

struct LoadSummary {
  int64_t steps = 0;
  double step_seconds = 0;               // mean
  double prefill_tokens_per_second = 0;  // 0 without prefill steps in the window
  double decode_tokens_per_second = 0;
};

class LoadWindow {
 public:
  static constexpr size_t kMaxSteps = 1 << 16;
  explicit LoadWindow(absl::Duration window) : window_(absl::ToChronoNanoseconds(window)) {}

  void Record(const StepInfo& step);
  LoadSummary Summary();
  double window_seconds() const { return std::chrono::duration<double>(window_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    Clock::time_point at;
    StepInfo step;
  };
  void Trim(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock::duration window_;
  absl::Mutex mu_;
  std::deque<Entry> steps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_LOAD_WINDOW_H_
