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

#ifndef FERRY_ENGINE_COMMON_THREAD_POOL_H_
#define FERRY_ENGINE_COMMON_THREAD_POOL_H_

#include <cstddef>
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
  void WorkerLoop();
  // Claims and runs indices of the current job until none are left.
  void RunIndices();

  absl::Mutex call_mu_;  // serializes ParallelFor calls
  absl::Mutex mu_;
  const std::function<void(size_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t job_size_ ABSL_GUARDED_BY(mu_) = 0;
  size_t next_index_ ABSL_GUARDED_BY(mu_) = 0;
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_THREAD_POOL_H_
