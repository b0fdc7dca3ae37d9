// A fixed set of worker threads for data-parallel loops (no thread is created per call).
//
//   ThreadPool pool(4);
//   pool.ParallelFor(n, [&](size_t i) { out[i] = Work(in[i]); });
//
// ParallelFor runs fn(0..n-1) on the workers and the calling thread, and returns when all have
// finished. Which thread runs which index is unspecified: callers must make results depend only
// on the index (Ferry's determinism rule), never on the thread.
//
// Thread-safe: several threads may call ParallelFor on one pool; calls are served one at a time.
// A ParallelFor issued from inside a ParallelFor body of the same pool runs inline on the calling
// thread (instead of waiting for a pool that is busy with its caller).
//
// Built for many short calls (the engine issues hundreds per decode step): indices are claimed
// with an atomic counter, and idle workers spin for a short while (kSpinMicros) before they
// sleep, so back-to-back calls do not pay a wake-up each.

#ifndef FERRY_ENGINE_COMMON_THREAD_POOL_H_
#define FERRY_ENGINE_COMMON_THREAD_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

class ThreadPool {
 public:
  // `threads` counts the caller: ThreadPool(1) runs everything on the calling thread.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  // A process-wide pool with one thread per available core, created on first use.
  static ThreadPool& Shared();

 private:
  // How long an idle worker polls for the next call before it sleeps.
  static constexpr int64_t kSpinMicros = 200;

  void WorkerLoop();
  // Claims and runs indices of `fn` until none are left.
  void RunIndices(const std::function<void(size_t)>& fn, size_t n);

  absl::Mutex call_mu_;  // serializes ParallelFor calls

  // The current call. job_ and size_ are written under mu_ while no worker holds the previous job
  // (active_ == 0); workers register under mu_ before they read them.
  absl::Mutex mu_;
  absl::CondVar wake_;
  const std::function<void(size_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t size_ ABSL_GUARDED_BY(mu_) = 0;
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> generation_{0};
  std::atomic<size_t> next_index_{0};
  std::atomic<size_t> done_{0};
  std::atomic<int> active_{0};  // workers registered in the current call
  std::vector<std::thread> workers_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_THREAD_POOL_H_
