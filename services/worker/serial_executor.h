// One thread that runs tasks in the order they were added, for work that must not run on the
// engine thread or a gRPC callback thread (which must not block): a prefill worker connects to
// decode workers and starts its pushes here.
//
// Bounded: Add refuses (returns false) beyond `max_tasks` waiting. The destructor runs what is
// queued, then joins. Thread-safe.

#ifndef FERRY_SERVICES_WORKER_SERIAL_EXECUTOR_H_
#define FERRY_SERVICES_WORKER_SERIAL_EXECUTOR_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

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
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_SERIAL_EXECUTOR_H_
