#include "engine/common/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry {
namespace {

// The pool whose work the current thread is doing, if any.
thread_local const ThreadPool* tls_current_pool = nullptr;

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// Waits for `done()` by spinning, giving the CPU away between polls after the first few
// thousand: the thread being waited for may be runnable but without a CPU (more runnable
// threads than cores: the router, the RPC threads, a neighbour), and a waiter that only spins
// keeps it off the core it spins on until the scheduler's tick.
template <typename Done>
void SpinUntil(Done done) {
  for (int polls = 0; !done(); ++polls) {
    if (polls < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  generation_.fetch_add(1);
  wake_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::Shared() {
  static ThreadPool* const pool =
      new ThreadPool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return *pool;
}

void ThreadPool::RunIndices(const std::function<void(size_t)>& fn, size_t n) {
  while (true) {
    const size_t i = next_index_.fetch_add(1);
    if (i >= n) return;
    fn(i);
    done_.fetch_add(1);
  }
}

void ThreadPool::WorkerLoop() {
  tls_current_pool = this;
  uint64_t seen = 0;
  while (true) {
    // Poll for a new call for a while, then sleep until one is announced.
    const auto spin_until =
        std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
    int polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      ++polls;
      if (polls < 4096) {
        CpuRelax();
      } else {
        std::this_thread::yield();  // as SpinUntil's
      }
      if (polls % 64 == 0 && std::chrono::steady_clock::now() > spin_until) break;
    }
    const std::function<void(size_t)>* job;
    size_t n;
    {
      absl::MutexLock lock(&mu_);
      if (generation_.load() == seen && !stopping_) {
        ++sleepers_;
        while (!stopping_ && generation_.load() == seen) wake_.Wait(&mu_);
        --sleepers_;
      }
      if (stopping_) return;
      seen = generation_.load();
      job = job_;
      n = size_;
      if (job == nullptr) continue;  // that call has already finished
      active_.fetch_add(1);
    }
    RunIndices(*job, n);
    active_.fetch_sub(1);
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1 || tls_current_pool == this) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  absl::MutexLock call_lock(&call_mu_);
  bool wake = false;
  {
    absl::MutexLock lock(&mu_);
    job_ = &fn;
    size_ = n;
    next_index_.store(0);
    done_.store(0);
    generation_.fetch_add(1, std::memory_order_release);
    wake = sleepers_ > 0;
  }
  if (wake) wake_.SignalAll();
  const ThreadPool* const outer = tls_current_pool;
  tls_current_pool = this;
  RunIndices(fn, n);
  tls_current_pool = outer;
  SpinUntil([&] { return done_.load(std::memory_order_acquire) >= n; });
  {
    absl::MutexLock lock(&mu_);
    job_ = nullptr;  // no worker registers for this call any more
  }
  // Workers that registered may still be between their last claim and leaving.
  SpinUntil([&] { return active_.load(std::memory_order_acquire) == 0; });
}

}  // namespace ferry
