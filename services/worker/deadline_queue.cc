#include "services/worker/deadline_queue.h"

#include "absl/time/clock.h"

namespace ferry {

DeadlineQueue::DeadlineQueue(std::function<void(const std::string& id)> expire)
    : expire_(std::move(expire)), thread_([this] { Run(); }) {}

DeadlineQueue::~DeadlineQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void DeadlineQueue::Add(const std::string& id, absl::Time deadline) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries_.emplace(deadline, id);
  }
  wake_.notify_all();
}

void DeadlineQueue::Remove(const std::string& id, absl::Time deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase({deadline, id});
}

size_t DeadlineQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void DeadlineQueue::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (entries_.empty()) {
      wake_.wait(lock);
      continue;
    }
    const absl::Time next = entries_.begin()->first;
    const absl::Time now = absl::Now();
    if (next > now) {
      wake_.wait_for(lock, absl::ToChronoNanoseconds(next - now));
      continue;
    }
    const std::string id = entries_.begin()->second;
    entries_.erase(entries_.begin());
    lock.unlock();
    expire_(id);
    lock.lock();
  }
}

}  // namespace ferry
