// Sending requests to workers (ARCHITECTURE.md §6 admission, §7 failure): each request goes to a
// worker the routing policy picks among the registry's candidates, as one Generate stream whose
// events reach the request's sink as they arrive.
//
//   - Admission: when no candidate can take a request (every worker at its capacity), it waits
//     in a bounded queue (max_queued); beyond it Dispatch answers ResourceExhausted (429 with
//     Retry-After at the front door); with no worker that can take requests (none up, or every
//     one draining), Unavailable (503). A queued request that reaches its deadline ends with
//     DeadlineExceeded.
//   - Retries: a worker that fails a request before its first token (unreachable, its queue full,
//     draining, or an error it marks retryable) makes the request go to another worker, at most
//     max_retries times.
//   - Cancel (the client went away): the queued request is dropped, or the stream is cancelled,
//     which aborts the request on the worker at its next step.
//   - Load: the router's own load on each worker (registry AddLoad) is exact at once: requests in
//     flight, prompt tokens sent and not yet computed (until the first token, or the end of the
//     prefill call), prompt tokens of streams on decode workers; the policy adds it to what the
//     workers report, which lags.
//   - Prefill/decode (ARCHITECTURE.md §3): a decode worker is a candidate while a prefill worker
//     can take the request too; its stream's first event is a KV reservation, which the
//     dispatcher hands to a prefill worker (Prefill) the policy picks. A failed prefill ends the
//     stream and is retried (another prefill worker, a new reservation) before the first token;
//     a cancel reaches both workers.
//
// Threads: a request's stream, and its prefill call, run on one of the `completions` threads
// (round robin), and its sink is called there, in order, never after OnEnd; sinks must not block
// (they would stall every stream of that thread). OnEnd of a request that never started (queued,
// then dropped) comes on the thread that ended it. Thread-safe.

#ifndef FERRY_ROUTER_DISPATCH_DISPATCHER_H_
#define FERRY_ROUTER_DISPATCH_DISPATCHER_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "router/policy/routing_policy.h"
#include "router/registry/worker_registry.h"
#include "services/common/completion_thread.h"

namespace ferry {

class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  // Which worker serves the request (again after a retry).
  virtual void OnRouted(const std::string& worker_id) {}
  // Every event of the stream, in order.
  virtual void OnEvent(const ferry::v1::GenerateEvent& event) = 0;
  // Once, last: OK when the stream completed; otherwise why it ended.
  virtual void OnEnd(const absl::Status& status) = 0;
};

struct DispatchRequest {
  ferry::v1::GenerateRequest request;
  std::string trace_id;
  absl::Time deadline = absl::InfiniteFuture();
  int64_t prompt_tokens = 0;
  // The prompt's block hashes (request.block_hashes, as computed), and how many of the leading
  // ones the KV store holds (0: none or unknown).
  std::vector<Hash128> block_hashes;
  int64_t store_prefix_blocks = 0;
};

struct DispatcherOptions {
  int64_t max_queued = 256;
  int max_retries = 2;
  std::string auth_token;  // sent to the workers
  // Where the streams complete (each must outlive the dispatcher); empty: one thread of its own.
  std::vector<CompletionThread*> completions;
};

// Counters the dispatcher reports (router metrics).
struct DispatchObserver {
  std::function<void(const std::string& policy, const std::string& worker)> routed;
  // Each decision of the policy (the stream's worker, and a P/D request's prefill worker).
  std::function<void(const std::string& policy, const RouteChoice& choice)> decided;
  // A request's usage arrived: the prompt tokens the policy expected the worker that computed it
  // to reuse from its memory and read from the store, and what it did.
  std::function<void(int64_t predicted_local, int64_t predicted_store, int64_t reused_local,
                     int64_t reused_store)>
      prefix;
  std::function<void()> retried;
  std::function<void(int64_t depth)> queue_depth;
};

class Dispatcher {
 public:
  class Job;

  // `registry` and `policy` must outlive the dispatcher.
  Dispatcher(WorkerRegistry* registry, RoutingPolicy* policy, DispatcherOptions options,
             DispatchObserver observer = {});
  ~Dispatcher();  // ends queued requests (Unavailable) and waits for running streams

  // Starts (or queues) the request. Errors, before anything was sent: Unavailable (no worker up),
  // ResourceExhausted (the queue is full). The handle cancels it.
  absl::StatusOr<std::shared_ptr<Job>> Dispatch(DispatchRequest request,
                                                std::shared_ptr<GenerateSink> sink);
  void Cancel(const std::shared_ptr<Job>& job);

  int64_t queued() const;
  int64_t running() const;

  // Ends every queued request (shutdown); running ones go on.
  void DropQueue(const absl::Status& why);
  // Starts queued requests while candidates can take them (the registry calls it on changes).
  // Never call it holding a lock the sinks take.
  void Pump();

  class Call;

 private:
  friend class Call;
  // Starts `job` on a candidate, or returns false when none can take it now.
  bool TryStart(const std::shared_ptr<Job>& job);
  // The registry's candidates, less the workers that failed `job`.
  std::vector<Candidate> CandidatesFor(const std::shared_ptr<Job>& job);
  // The P/D path: a prefill worker for `job` and the policy's choice (Unavailable when none can
  // take it).
  absl::StatusOr<std::pair<Candidate, RouteChoice>> PickPrefill(const std::shared_ptr<Job>& job);
  // The policy's choice among `candidates` for `job`.
  RouteChoice Choose(const std::vector<Candidate>& candidates, const std::shared_ptr<Job>& job);
  void Routed(const std::string& worker);
  // `worker` streamed the request; `failed` is the worker to avoid on a retry (the stream's, or
  // the prefill worker's when the prefill failed).
  void CallEnded(const std::shared_ptr<Job>& job, const std::string& worker,
                 const std::string& failed, const absl::Status& status, bool started,
                 bool retryable);
  void TimerLoop();

  WorkerRegistry* const registry_;
  RoutingPolicy* const policy_;
  const DispatcherOptions options_;
  const DispatchObserver observer_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // the timer loop's
  std::condition_variable idle_cv_;  // the destructor's: the last running stream ended
  std::deque<std::shared_ptr<Job>> queue_;
  int64_t running_ = 0;
  bool stopping_ = false;
  std::thread timer_;
  // The streams' completion threads and the next one to take a stream.
  std::unique_ptr<CompletionThread> own_completions_;
  std::vector<CompletionThread*> completions_;
  std::atomic<uint64_t> next_completion_{0};
};

}  // namespace ferry

#endif  // FERRY_ROUTER_DISPATCH_DISPATCHER_H_
