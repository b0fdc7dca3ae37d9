// A fixed pool of threads running jobs from a bounded FIFO queue: the encoder's image executor.
// TrySubmit refuses (false) when max_queued jobs already wait, so a burst is answered
// RESOURCE_EXHAUSTED by the caller instead of queueing without bound. Jobs check for themselves
// whether their callers are still there when they start (the executor knows no RPC).
//
// Thread-safe. The destructor runs the jobs still queued, then joins the threads.

#ifndef FERRY_SERVICES_ENCODER_BOUNDED_EXECUTOR_H_
#define FERRY_SERVICES_ENCODER_BOUNDED_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

class BoundedExecutor {
 public:
  BoundedExecutor(int threads, int64_t max_queued);
  ~BoundedExecutor();
  BoundedExecutor(const BoundedExecutor&) = delete;
  BoundedExecutor& operator=(const BoundedExecutor&) = delete;

  // Queues `job`; false (and `job` dropped) when max_queued jobs already wait.
  bool TrySubmit(std::function<void()> job);

  // Blocks until no job is queued or running, or `deadline`; whether it got idle.
  bool WaitIdle(absl::Time deadline);

  int64_t queued() const;
  int64_t running() const;
  int64_t max_queued() const { return max_queued_; }
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  const int64_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_ENCODER_BOUNDED_EXECUTOR_H_
