#include "services/worker/serial_executor.h"

namespace ferry {

SerialExecutor::SerialExecutor(size_t max_tasks)
    : max_tasks_(max_tasks), thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool SerialExecutor::Add(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (tasks_.size() >= max_tasks_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void SerialExecutor::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stopping, and everything ran
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

}  // namespace ferry
