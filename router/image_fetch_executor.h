// The threads on which the router's blocking image work runs: an API call whose request holds
// remote image URLs (router/api/image_url_fetcher.h) hands the rest of its pipeline (fetch, check,
// prompt, hash, dispatch) to one instance instead of blocking the HTTP I/O thread; with
// --encoders, a call with images hands its Encode calls (router/encode/encoder_pool.h) and the
// rest of its pipeline to another.
//
// Bounded: `threads` run tasks in arrival order, at most `max_queued` wait for a thread; Submit
// refuses a task beyond that (the caller answers 503 and counts it). The destructor drops the tasks
// still queued (their owners hear nothing: the router is shutting down) and waits for the running
// ones.
//
// Thread-safe.

#ifndef FERRY_ROUTER_IMAGE_FETCH_EXECUTOR_H_
#define FERRY_ROUTER_IMAGE_FETCH_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

class ImageFetchExecutor {
 public:
  ImageFetchExecutor(int threads, int64_t max_queued);
  ~ImageFetchExecutor();
  ImageFetchExecutor(const ImageFetchExecutor&) = delete;
  ImageFetchExecutor& operator=(const ImageFetchExecutor&) = delete;

  // False when every thread is busy and max_queued tasks already wait (or it is stopping).
  bool Submit(std::function<void()> task);

  int64_t queued() const;

 private:
  void Run();

  const int64_t max_queued_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_IMAGE_FETCH_EXECUTOR_H_
