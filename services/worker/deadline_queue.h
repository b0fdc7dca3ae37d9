// Request deadlines (RequestContext.deadline_unix_ms): one thread that calls `expire(id)` when a
// request's absolute deadline passes, unless the request was removed first. Bounded: one entry
// per live request (callers remove an entry when its request ends).
//
// Thread-safe. `expire` runs on the queue's thread, never under its lock.

#ifndef FERRY_SERVICES_WORKER_DEADLINE_QUEUE_H_
#define FERRY_SERVICES_WORKER_DEADLINE_QUEUE_H_

#include <functional>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

class DeadlineQueue {
 public:
  explicit DeadlineQueue(std::function<void(const std::string& id)> expire);
  ~DeadlineQueue();  // stops the thread; pending deadlines never fire
  DeadlineQueue(const DeadlineQueue&) = delete;
  DeadlineQueue& operator=(const DeadlineQueue&) = delete;

  void Add(const std::string& id, absl::Time deadline);
  void Remove(const std::string& id, absl::Time deadline);
  size_t size() const;

 private:
  void Run();

  const std::function<void(const std::string&)> expire_;
  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  std::set<std::pair<absl::Time, std::string>> entries_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_DEADLINE_QUEUE_H_
