#include "services/encoder/bounded_executor.h"

#include <utility>

namespace ferry {

BoundedExecutor::BoundedExecutor(int threads, int64_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

BoundedExecutor::~BoundedExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

bool BoundedExecutor::TrySubmit(std::function<void()> job) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(queue_.size()) >= max_queued_) return false;
  queue_.push_back(std::move(job));
  return true;
}

bool BoundedExecutor::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && running_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

int64_t BoundedExecutor::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t BoundedExecutor::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

void BoundedExecutor::Loop() {
  for (;;) {
    std::function<void()> job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    job();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace ferry
