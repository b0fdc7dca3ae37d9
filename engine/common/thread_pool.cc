#include "engine/common/thread_pool.h"

#include <algorithm>

namespace ferry {
namespace {

// The pool whose work the current thread is doing, if any.
thread_local const ThreadPool* tls_current_pool = nullptr;

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::Shared() {
  static ThreadPool* const pool =
      new ThreadPool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return *pool;
}

void ThreadPool::RunIndices() {
  while (true) {
    const std::function<void(size_t)>* job;
    size_t index;
    {
      absl::MutexLock lock(&mu_);
      if (job_ == nullptr || next_index_ >= job_size_) return;
      job = job_;
      index = next_index_++;
    }
    (*job)(index);
    absl::MutexLock lock(&mu_);
    ++done_;
  }
}

void ThreadPool::WorkerLoop() {
  tls_current_pool = this;
  uint64_t seen = 0;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this, &seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || (generation_ != seen && job_ != nullptr);
      };
      mu_.Await(absl::Condition(&has_work));
      if (stopping_) return;
      seen = generation_;
    }
    RunIndices();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1 || tls_current_pool == this) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  {
    absl::MutexLock lock(&mu_);
    job_ = &fn;
    job_size_ = n;
    next_index_ = 0;
    done_ = 0;
    ++generation_;
  }
  const ThreadPool* const outer = tls_current_pool;
  tls_current_pool = this;
  RunIndices();
  tls_current_pool = outer;
  absl::MutexLock lock(&mu_);
  auto finished = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_ == n; };
  mu_.Await(absl::Condition(&finished));
  job_ = nullptr;
}

}  // namespace ferry
