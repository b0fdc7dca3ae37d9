#include "router/image_fetch_executor.h"

#include <utility>

namespace ferry {

ImageFetchExecutor::ImageFetchExecutor(int threads, int64_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
}

ImageFetchExecutor::~ImageFetchExecutor() {
  std::deque<std::function<void()>> dropped;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    dropped.swap(queue_);
  }
  dropped.clear();  // outside the lock: a task's captures may run destructors that submit
  for (std::thread& t : threads_) t.join();
}

bool ImageFetchExecutor::Submit(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  // Room: an idle thread for each task queued beyond max_queued.
  const int64_t idle = static_cast<int64_t>(threads_.size()) - running_;
  if (stopping_ || static_cast<int64_t>(queue_.size()) >= max_queued_ + idle) return false;
  queue_.push_back(std::move(task));
  return true;
}

int64_t ImageFetchExecutor::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

void ImageFetchExecutor::Run() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      const auto ready = [this] {
        mu_.AssertHeld();
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    task();
    task = nullptr;  // its captures go before the thread counts as idle
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace ferry
