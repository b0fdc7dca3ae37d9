// Sending requests to workers (ARCHITECTURE.md §6 admission, §7 failure): each request goes to a
// worker the routing policy picks among the registry's candidates, as one Generate stream whose
// events reach the request's sink as they arrive.
//
//   - Admission and outages: a request no candidate can take (every worker at its capacity, none
//     up, all draining, all excluded, no decode worker with room for its KV) waits in a bounded
//     queue, in arrival order (max_queued requests, max_queued_tokens prompt tokens: beyond them
//     Dispatch answers ResourceExhausted, 429 with Retry-After at the front door), and starts as
//     soon as a worker can take it. It gives up after queue_timeout in all, or at its deadline if
//     sooner, with Unavailable (503 with Retry-After) saying why it waited. A retry, a migration
//     or a KV refusal that finds no worker waits at the queue's front the same way.
//   - Retries: a worker that fails a request before its first token (unreachable, its queue full,
//     draining, or an error it marks retryable) makes the request go to another worker, at most
//     max_retries times. A worker that failed a request is avoided for it while another can take
//     it, and until it comes back up after going down.
//   - KV pressure: a decode worker that cannot reserve a request's KV refuses it (ErrorInfo
//     kv_blocks_needed); the request waits in the queue, neither counted as a retry nor avoiding
//     that worker, until a decode worker's Watch shows room for it (dispatch_rules.h KvRoom).
//   - Attempt ids: every attempt (retries, migrations, hand-offs) runs under its own request id
//     (the client's, then "<id>.a2", ...), and an abandoned attempt is aborted on every worker it
//     touched (its stream's and its prefill worker; a worker down then is told when it comes
//     back). A worker answering ALREADY_EXISTS (a reused id: the router's bug) is logged,
//     counted, and the request restarted under the next id; the client never sees a 409.
//   - Migration (ARCHITECTURE.md §7): the dispatcher keeps what each streaming request's client
//     received (every choice's token ids and the stop-string tail the worker held back), within
//     max_tracked_tokens_per_request and max_tracked_tokens in all (a request over either is no
//     longer tracked: it cannot migrate). When a stream that sent tokens fails (the worker died
//     and the stream broke, the registry found the worker down, or the worker failed the
//     request), the request goes to another worker (or P/D pair) with a resume point: the prompt
//     and the output so far are re-prefilled there (mostly prefix hits), sampling continues where
//     it stopped (position-keyed, so the continuation is the one the failed worker would have
//     produced), and the same sink receives the rest: no token lost or repeated, usage counted
//     once. At most max_migrations per request; one that cannot migrate (untracked, several
//     choices, past its deadline, out of migrations) ends with its error.
//   - Drain hand-off: a draining worker stops a running single-choice request at its drain
//     deadline with its KV kept and ends the stream with a retryable error naming itself
//     (ErrorInfo.handoff_endpoint). The request migrates (cause "drain_handoff") to a worker of
//     the same role, never that one, under the next attempt id, with the usual resume point and
//     GenerateRequest.handoff_source_endpoint (and _request_id, the stopped attempt's): the target
//     pulls the KV from the source (PushKv), so a decode target's reservation goes to no prefill
//     worker, and an aggregated target's reservation (sent on a hand-off only) is skipped. A
//     hand-off that fails before its first token (the target's error, a broken stream, the target
//     down, or no worker of that role to take it) falls back to a re-prefill migration (cause
//     "handoff_failed"; with no target, none: the same attempt id). Both count against
//     max_migrations; a request that cannot migrate (untracked, several choices, ...) ends with its
//     error as above.
//   - Images sent by encoder handle (DispatchRequest.inline_images): a retry or migration sends
//     their bytes inline instead (a handle's encoder may have died, or the handle expired). An
//     attempt with handles that a worker refuses before its first token as FAILED_PRECONDITION
//     (the encoder's tower is not the worker's) or INVALID_ARGUMENT is retried too (inline).
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
//   - Token streams (docs/design/token-streams.md): a request's tokens come on its worker's token
//     stream (one per worker, token_stream_hub.h, opened at the first request there) once that is
//     open, and its reservation, last event and status on its own Generate call. The last event
//     waits for the chunks it counts; a token stream that ends under a request ends that attempt
//     as a broken stream (it migrates, as above).
//
// Threads: a request's stream, and its prefill call, run on one of the `completions` threads
// (round robin), its worker's token stream on one of them too; its sink is called on either, one
// call at a time, in order, never after OnEnd; sinks must not block (they would stall every
// stream of that thread). OnEnd of a request that never started (queued, then dropped) comes on
// the thread that ended it. Thread-safe.

#ifndef FERRY_ROUTER_DISPATCH_DISPATCHER_H_
#define FERRY_ROUTER_DISPATCH_DISPATCHER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "router/dispatch/dispatch_rules.h"
#include "router/dispatch/job_record.h"
#include "router/dispatch/token_stream_hub.h"
#include "router/policy/routing_policy.h"
#include "router/registry/worker_registry.h"
#include "services/common/completion_thread.h"
#include "services/common/shared_token.h"

namespace ferry {

class GenerateSink {
 public:
  virtual ~GenerateSink() = default;
  // Which worker serves the request (again after a retry).
  virtual void OnRouted(const std::string& worker_id) {}
  // Every event of the stream, in order. Events that arrived together (one message of a worker)
  // come as OnEvent for each, then OnBatchEnd: a sink may hold its output until then and write it
  // at once (one write per request per worker message).
  virtual void OnEvent(const ferry::v1::GenerateEvent& event) = 0;
  virtual void OnBatchEnd() {}
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
  // For each of request's images (PromptImage, in order) sent by encoder handle or not at all
  // (expect_cached), its bytes ("": one sent inline). The first attempt sends the handles; every
  // later one (a retry, a migration, a hand-off) sends these bytes inline instead, so no attempt
  // resends a handle whose encoder may be what failed, or again expects cached what was not (the
  // worker encodes them in process). docs/serving/encoder.md.
  std::vector<std::string> inline_images;
};

struct DispatcherOptions {
  int64_t max_queued = 256;
  int64_t max_queued_tokens = 0;  // prompt tokens waiting (0: no bound)
  absl::Duration queue_timeout = absl::Seconds(30);
  int max_retries = 2;
  int max_migrations = 3;
  int64_t max_tracked_tokens_per_request = 65536;
  int64_t max_tracked_tokens = 16 << 20;  // 64 MiB of token ids
  // Attempts moved away from a worker that went down, kept to Abort there when it comes back
  // (for 1,024 workers at most).
  int64_t max_orphans_per_worker = 4096;
  absl::Duration abort_timeout = absl::Seconds(2);
  SharedToken auth_token;  // sent to the workers
  // Where the streams complete (each must outlive the dispatcher); empty: one thread of its own.
  std::vector<CompletionThread*> completions;
  // Requests' output comes on one token stream per worker (token_stream_hub.h); false: on each
  // request's own Generate call.
  bool token_streams = true;
  // Drain pre-copy: a worker's handoff_planned picks the hand-off's target at once and asks it to
  // pre-copy the KV so far (PrefetchKv); the hand-off then goes to that target.
  bool handoff_precopy = true;
  // Deadlines are checked on it (must outlive the dispatcher); null: the real clock.
  Clock* clock = nullptr;
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
  // A P/D request's prefill worker answered: its time in the engine's queue, computing the
  // prompt, the push's tail after the compute (what the first token waited for), and reading
  // the prompt's prefix from the KV store, in seconds (PrefillResponse).
  std::function<void(double queue, double compute, double push_tail, double store_read)>
      prefill_phases;
  std::function<void()> retried;
  // A retry or migration sent `images` inline instead of their encoder handles.
  std::function<void(int64_t images)> images_inlined;
  // The queue now: its requests, and their prompt (and resumed output) tokens.
  std::function<void(int64_t depth, int64_t tokens)> queue_depth;
  // A request left the queue after `seconds` there (to start, or to end), waiting for `pool`
  // (dispatch_rules.h QueuePool).
  std::function<void(const char* pool, double seconds)> queue_wait;
  // A queued request gave up waiting: "queue_timeout", "deadline" (QueueExpiry::reason).
  std::function<void(const std::string& reason)> queue_expired;
  // A decode worker refused a request for want of KV: it waits in the queue for room.
  std::function<void()> kv_wait;
  // A worker refused an attempt as already running (the router reused an attempt id: a bug).
  std::function<void()> collision;
  // A request moved mid-stream: why ("stream_broken", "worker_down", "worker_error",
  // "drain_handoff", "handoff_failed") and the output tokens it carried over.
  std::function<void(const std::string& cause, int64_t tokens)> migrated;
  // A drain hand-off's outcome: "completed" (the target streamed a token, or ended the request),
  // "fell_back" (it failed, or no target could take it: the request resumes by re-prefill),
  // "failed" (it failed and the request could not go on). Not counted when the client left.
  std::function<void(const std::string& outcome)> handoff;
  // A drain pre-copy's outcome: "done" (the target holds the KV so far), "failed".
  std::function<void(const std::string& outcome)> precopy;
  // A request failed: "worker_error" (before any token, no other worker), "no_worker",
  // "migration_limit", "untracked", "several_choices", "deadline".
  std::function<void(const std::string& cause)> failed;
  // A request's output went over a tracking cap (it can no longer migrate).
  std::function<void()> untracked;
  // An Abort of an abandoned attempt sent to a worker it touched (at once, or when the worker
  // came back): "found", "not_found", "failed".
  std::function<void(const std::string& outcome)> orphan_abort;
  // Token streams open now; a message read from one (its chunks, and those whose request had
  // left).
  std::function<void(int64_t open)> token_streams;
  std::function<void(int64_t chunks, int64_t dropped)> token_stream_message;
};

class Dispatcher {
 public:
  class Job;

  // `registry` and `policy` must outlive the dispatcher.
  Dispatcher(WorkerRegistry* registry, RoutingPolicy* policy, DispatcherOptions options,
             DispatchObserver observer = {});
  ~Dispatcher();  // ends queued requests (Unavailable) and waits for running streams

  // Starts (or queues) the request. Errors, before anything was sent: ResourceExhausted (the
  // queue is full), Unavailable (the router stops). The handle cancels it.
  absl::StatusOr<std::shared_ptr<Job>> Dispatch(DispatchRequest request,
                                                std::shared_ptr<GenerateSink> sink);
  void Cancel(const std::shared_ptr<Job>& job);

  // The leading positions of a prompt (`prompt_tokens` tokens, `block_hashes` of
  // `block_tokens`) that a worker that can compute it now holds, as the policy predicts them
  // (RoutingPolicy::CachedPositions; 0 with none).
  int64_t CachedPositions(absl::Span<const Hash128> block_hashes, int64_t prompt_tokens,
                          int64_t block_tokens) const;

  int64_t queued() const;
  int64_t running() const;

  // Ends every queued request (shutdown); running ones go on.
  void DropQueue(const absl::Status& why);
  // Starts queued requests while candidates can take them (the registry calls it on changes).
  // Never call it holding a lock the sinks take.
  void Pump();
  // The registry's up/down transitions (WorkerRegistry::SetOnWorkerState): a worker that went
  // down loses its streams (they migrate) and its prefills before the first token (they are
  // retried); one that came back is told to Abort the attempts that moved away from it.
  void OnWorkerState(const std::string& id, bool up);

  // Token ids tracked for migration now (all requests).
  int64_t tracked_tokens() const { return tracked_tokens_.load(); }

  class Call;

 private:
  friend class Call;
  // Starts `job` on a candidate, or returns false when none can take it now.
  bool TryStart(const std::shared_ptr<Job>& job);
  // The candidates' load views (what the dispatch rules and the policy see), and the candidates
  // at `indices` (what the rules picked).
  static std::vector<WorkerLoadView> Views(const std::vector<Candidate>& candidates);
  static std::vector<Candidate> Subset(std::vector<Candidate> candidates,
                                       const std::vector<size_t>& indices);
  // The P/D path: a prefill worker for `job` and the policy's choice (Unavailable when none can
  // take it).
  absl::StatusOr<std::pair<Candidate, RouteChoice>> PickPrefill(const std::shared_ptr<Job>& job);
  // The policy's choice among `candidates` for `job`.
  RouteChoice Choose(const std::vector<Candidate>& candidates, const std::shared_ptr<Job>& job);
  void Routed(const std::string& worker);
  // Attempt `attempt_id` of `job`, streaming from `source`, will be handed off at `deadline` (its
  // worker drains): picks the hand-off's target now (JobRecord::precopy_target) and asks it to
  // pre-copy the KV so far (PrefetchKv, asynchronous; its outcome only counted). Nothing when no
  // target can take it, or the attempt is not the job's running one.
  void PlanHandoff(const std::shared_ptr<Job>& job, const std::string& source,
                   const std::string& source_endpoint, const std::string& attempt_id,
                   absl::Time deadline);
  // The running attempt of `job` ended (`error`: the worker's error event, held back from the
  // sink): the dispatch rules decide what follows (dispatch_rules.h DecideAfterAttempt), and this
  // carries it out: a restart elsewhere, the queue's front, or the end.
  void CallEnded(const std::shared_ptr<Job>& job, const AttemptOutcome& outcome,
                 const ferry::v1::GenerateEvent* error);
  // The job ends as `decision` says: its record lets go, the failure is counted, the sink gets
  // the error event (if shown) and OnEnd.
  void End(const std::shared_ptr<Job>& job, const Decision& decision,
           const ferry::v1::GenerateEvent* error);
  // Adds a chunk the sink received to the job's record (the next attempt's resume point).
  void Record(Job& job, const ferry::v1::TokenChunk& chunk);
  // The job's record leaves the total (its end).
  void Untrack(Job& job);
  // Sends Abort for `ids` to worker `id` if it is up; otherwise keeps them for its return.
  void AbortOrphans(const std::string& id, std::vector<std::string> ids);
  // Keeps `attempt`, moved away from worker `id`, to Abort there when it comes back.
  void KeepOrphan(const std::string& id, const std::string& attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `job` joins the queue (at its front: a restart) or leaves it, keeping the totals.
  void Enqueue(const std::shared_ptr<Job>& job, bool front) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Dequeued(const std::shared_ptr<Job>& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  WorkerRegistry* const registry_;
  RoutingPolicy* const policy_;
  const DispatcherOptions options_;
  const DispatchObserver observer_;
  Clock* const clock_;
  DispatchLimits limits_;
  TrackingLimits tracking_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;       // the timer loop's
  absl::CondVar idle_cv_;  // the destructor's: the last running stream ended
  std::deque<std::shared_ptr<Job>> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // its jobs' prompt tokens
  int64_t running_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::shared_ptr<Job>> streaming_ ABSL_GUARDED_BY(mu_);  // jobs with a Call running
  // Attempts (request ids) moved away from each worker that went down.
  std::map<std::string, std::deque<std::string>> orphans_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> tracked_tokens_{0};
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;
  // The streams' completion threads and the next one to take a stream.
  std::unique_ptr<CompletionThread> own_completions_;
  std::vector<CompletionThread*> completions_;
  std::atomic<uint64_t> next_completion_{0};
  // The workers' token streams (read on completions_; destroyed before own_completions_).
  std::unique_ptr<TokenStreamHub> token_streams_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_DISPATCH_DISPATCHER_H_
