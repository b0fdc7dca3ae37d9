#include "services/worker/deadline_queue.h"

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace ferry {

DeadlineQueue::DeadlineQueue(std::function<void(const std::string& id)> expire)
    : expire_(std::move(expire)), thread_([this] { Run(); }) {}

DeadlineQueue::~DeadlineQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  thread_.join();
}

void DeadlineQueue::Add(const std::string& id, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    entries_.emplace(deadline, id);
  }
  wake_.SignalAll();
}

void DeadlineQueue::Remove(const std::string& id, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  entries_.erase({deadline, id});
}

size_t DeadlineQueue::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

void DeadlineQueue::Run() {
  mu_.Lock();
  while (!stopping_) {
    if (entries_.empty()) {
      wake_.Wait(&mu_);
      continue;
    }
    const absl::Time next = entries_.begin()->first;
    const absl::Time now = absl::Now();
    if (next > now) {
      wake_.WaitWithDeadline(&mu_, next);
      continue;
    }
    const std::string id = entries_.begin()->second;
    entries_.erase(entries_.begin());
    mu_.Unlock();
    expire_(id);
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace ferry
