#include "services/worker/serial_executor.h"

namespace ferry {

SerialExecutor::SerialExecutor(size_t max_tasks)
    : max_tasks_(max_tasks), thread_([this] { Loop(); }) {}

SerialExecutor::~SerialExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

bool SerialExecutor::Add(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (tasks_.size() >= max_tasks_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.Signal();
  return true;
}

void SerialExecutor::Loop() {
  mu_.Lock();
  while (true) {
    while (!stopping_ && tasks_.empty()) cv_.Wait(&mu_);
    if (tasks_.empty()) break;  // stopping, and everything ran
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    mu_.Unlock();
    task();
    mu_.Lock();
  }
  mu_.Unlock();
}

}  // namespace ferry
