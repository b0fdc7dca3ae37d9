// One thread that runs tasks in the order they were added, for work that must not run on the
// engine thread or a gRPC callback thread (which must not block): a prefill worker connects to
// decode workers and starts its pushes here.
//
// Bounded: Add refuses (returns false) beyond `max_tasks` waiting. The destructor runs what is
// queued, then joins. Thread-safe.

#ifndef FERRY_SERVICES_WORKER_SERIAL_EXECUTOR_H_
#define FERRY_SERVICES_WORKER_SERIAL_EXECUTOR_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

class SerialExecutor {
 public:
  explicit SerialExecutor(size_t max_tasks);
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // False (and `task` is not run) when max_tasks are waiting.
  bool Add(std::function<void()> task);

 private:
  void Loop();

  const size_t max_tasks_;
  absl::Mutex mu_;
  absl::CondVar cv_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_SERIAL_EXECUTOR_H_
