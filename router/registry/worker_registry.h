// The router's view of its workers (ARCHITECTURE.md §6): the addresses it was given (flags or a
// file), and for each one a Watch subscription (worker.proto) that keeps the worker's identity,
// capacity, drain state and load current. Workers never need to know the router.
//
//   - A worker is accepted into the pool when its fingerprint, block size and protocol version
//     are the pool's (the first worker accepted sets them, or `fingerprint` pins the model; when
//     none is left the next sets them again); one that differs is refused (logged,
//     ferry_router_worker_refusals_total{reason} counts each worker's turn to refused). A refused
//     worker is asked again after a backoff, as a down one is, and stays "refused" until it
//     passes: an operator who restarts it on the right model needs no router restart.
//   - A worker whose stream breaks, or that sends nothing for heartbeat_timeout, is down: its
//     stream is cancelled and a new one tried every reconnect_interval. The addresses are known
//     workers, so the interval is short and fixed (no growing backoff), and their channels
//     reconnect at most that far apart too: a restarted worker is subscribed to, and takes work,
//     within about two intervals of its readiness.
//   - A draining worker gets no new work.
//   - KV events: each worker's stream feeds the KV index (kv_event_feed.h): a snapshot first,
//     then the events in order. A stream that breaks resumes where the index is (WatchRequest
//     after_sequence), so a reconnect costs a snapshot only when the worker no longer keeps the
//     events missed; a message whose numbering does not add up (a gap) ends the stream, and the
//     next one, started without a backoff, resynchronises (the worker is down until its first
//     message, as after any broken stream). A refused worker's blocks leave the index; a down one's
//     stay until its next snapshot (it may come back with its cache).
//   - The list changes at runtime (SetWorkers: the router re-reads its --workers_file on SIGHUP):
//     a new address is subscribed to as the first ones were; a removed worker gets no new work at
//     once, its Watch stream is cancelled, and its entry and KV index blocks go when that stream
//     has ended. Requests streaming from it are the dispatcher's and are left alone (a worker
//     scaled down drains and hands them off itself).
//   - Roles: aggregated workers serve a request alone; decode workers serve it with a prefill
//     worker (the P/D path). All share one pool (fingerprint, block size). Requests can be
//     served when an aggregated worker is up, or a decode and a prefill worker are.
//
// Time: the monitor checks heartbeats on `clock` (a FakeClock in tests), polling every
// check_interval of real time.
//
// Thread-safe.

#ifndef FERRY_ROUTER_REGISTRY_WORKER_REGISTRY_H_
#define FERRY_ROUTER_REGISTRY_WORKER_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "router/index/kv_index.h"
#include "router/policy/routing_policy.h"
#include "services/common/completion_thread.h"
#include "services/common/shared_token.h"

namespace ferry {

struct RegistryOptions {
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // Between a broken (or refused) Watch stream and the next one, and the longest a worker's
  // channel waits before connecting again.
  absl::Duration reconnect_interval = absl::Milliseconds(250);
  absl::Duration check_interval = absl::Milliseconds(50);  // real time
  SharedToken auth_token;                                  // sent to the workers
  // The one model fingerprint the pool takes (zero: whatever the first worker accepted has).
  Hash128 fingerprint;
  // Where the Watch streams complete (must outlive the registry); null: a thread of its own.
  CompletionThread* completions = nullptr;
  // The KV index the streams' events go to (must outlive the registry); null: one of its own.
  KvIndex* index = nullptr;
};

// The pool's shared facts, as the accepted workers reported them.
struct PoolInfo {
  bool known = false;
  Hash128 fingerprint;
  std::string model_name;
  uint32_t block_tokens = 0;
  uint32_t max_context_tokens = 0;
  uint32_t max_choices = 0;  // the smallest of the workers'
};

// A worker that can take a request now.
struct Candidate {
  std::string id;
  std::shared_ptr<ferry::v1::Worker::Stub> stub;
  WorkerLoadView load;
  ferry::v1::WorkerRole role = ferry::v1::WORKER_ROLE_AGGREGATED;
  std::string endpoint;  // where its Worker service is ("host:port"), for KvReady
};

class WorkerRegistry {
 public:
  // `addresses`: "host:port" each (one given twice is one worker). `clock` must outlive the
  // registry.
  WorkerRegistry(std::vector<std::string> addresses, RegistryOptions options, Clock* clock);
  ~WorkerRegistry();  // Stop()

  // Reads a worker list file: one "host:port" a line; blank lines and # comments skipped.
  static absl::StatusOr<std::vector<std::string>> ReadWorkerFile(const std::string& path);

  void Start();
  void Stop();

  // Makes `addresses` the workers (one given twice is one worker), before or after Start:
  //   - an address not listed is a new worker, subscribed to at once once started (a candidate
  //     when its first status is accepted, as the first workers were);
  //   - a listed worker still given keeps its state and stream;
  //   - a listed worker not given is removed at once: from then on it is no candidate and counts
  //     in neither AnyUp nor up_count, AddLoad and Drain do not find it, and no up/down
  //     transition is reported for it (requests streaming from it are the dispatcher's and keep
  //     streaming). Its Watch stream is cancelled; ToJson shows it as "removed" until the stream
  //     has ended, and then its entry and its blocks in the KV index go.
  // A removed address given again is a new worker: its router-side load counts (AddLoad) start at
  // zero. InvalidArgument for an address that is not "host:port" (nothing changes then);
  // FailedPrecondition once stopping.
  absl::Status SetWorkers(std::vector<std::string> addresses);

  // Accepted, up, not draining, and below their capacity (running + queued allowed, minus what
  // the router has in flight there).
  std::vector<Candidate> Candidates() const;
  // Whether requests can be served: an aggregated worker, or a decode and a prefill worker, up,
  // accepted and not draining.
  bool AnyUp() const;
  PoolInfo pool() const;
  // The pool's facts, or while no worker is accepted (all down or restarting) the last ones
  // (known false only before any worker was accepted).
  PoolInfo last_pool() const;
  // Worker `id`'s stub while it is up and accepted (full or draining included); null otherwise.
  std::shared_ptr<ferry::v1::Worker::Stub> UpStub(const std::string& id) const;
  // The stamp of worker `id`'s last load report (WorkerLoadView::load_reports); 0 if unknown.
  uint64_t LoadReports(const std::string& id) const;

  // The router's own load on worker `id` (the dispatcher keeps it): requests in flight, prompt
  // tokens sent and not yet computed, prompt tokens of streams running there. Never below 0.
  void AddLoad(const std::string& id, int requests, int64_t pending_prefill_tokens = 0,
               int64_t active_tokens = 0);
  const KvIndex& index() const { return *index_; }

  // Called (on registry threads, no lock held) whenever a worker comes up, goes down, changes
  // drain state or reports a new load: the dispatcher retries its queue.
  void SetOnChange(std::function<void()> callback);
  // Called (on the monitor thread) with the reason each time a worker is refused: "protocol",
  // "fingerprint", "block_tokens".
  void SetOnRefusal(std::function<void(const std::string&)> callback);
  // Called (on registry threads, no lock held, in the order they happened) when a worker that
  // was up goes down (its stream broke, or it sent nothing for heartbeat_timeout: a stalled or
  // cut-off worker) and when one comes up: the dispatcher moves the requests streaming from a
  // worker that went down, and tells one that came back to drop what it still holds for them.
  void SetOnWorkerState(std::function<void(const std::string& id, bool up)> callback);

  // The Drain RPC on worker `id`; NotFound for an unknown id.
  absl::StatusOr<ferry::v1::DrainResponse> Drain(const std::string& id, uint32_t grace_seconds);

  // GET /workers: every worker with its state, identity, load, in-flight count, last message
  // (listed ones first, in the order they were added; then removed ones whose stream is ending).
  nlohmann::json ToJson() const;

  // Listed workers up and accepted.
  int64_t up_count() const;

  class Subscription;

 private:
  struct Worker;
  // A new worker (not yet subscribed to), with its slot in the index.
  std::unique_ptr<Worker> NewWorker(const std::string& address);
  // Frees a worker whose stream is over (no lock held): its blocks leave the index.
  void Forget(std::unique_ptr<Worker> w);
  void MonitorLoop();
  void Connect(Worker& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnStatus(Worker* w, const ferry::v1::WorkerStatus& status);
  void OnStreamDone(Worker* w, uint64_t generation, const std::string& why);
  // A Subscription was deleted (its ClientContext with it): Stop waits for the last one.
  void SubscriptionGone();
  void MarkDown(Worker& w, const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Changed();
  // Reports the up/down transitions queued in transitions_ (no lock held).
  void ReportTransitions();

  const RegistryOptions options_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  // The listed workers, in the order they were added.
  // (A Worker's fields are guarded by mu_ too, unannotated: the struct cannot name the registry's
  // mutex.)
  std::vector<std::unique_ptr<Worker>> workers_ ABSL_GUARDED_BY(mu_);
  // Removed workers whose Watch stream has not ended yet: its callbacks still point at them.
  std::vector<std::unique_ptr<Worker>> removed_ ABSL_GUARDED_BY(mu_);
  absl::CondVar stop_cv_;
  PoolInfo pool_ ABSL_GUARDED_BY(mu_);
  PoolInfo last_pool_ ABSL_GUARDED_BY(mu_);
  uint64_t report_stamp_ ABSL_GUARDED_BY(mu_) = 0;  // load reports received, all workers
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t live_subscriptions_ ABSL_GUARDED_BY(mu_) = 0;  // created and not yet deleted
  std::thread monitor_;
  std::function<void()> on_change_;
  std::function<void(const std::string&)> on_refusal_;
  std::vector<std::string> refusals_ ABSL_GUARDED_BY(mu_);  // not yet reported to on_refusal_
  std::function<void(const std::string&, bool)> on_worker_state_;
  // Not yet reported to it.
  std::vector<std::pair<std::string, bool>> transitions_ ABSL_GUARDED_BY(mu_);
  absl::Mutex report_mu_;  // one ReportTransitions at a time: they arrive in order
  std::unique_ptr<CompletionThread> own_completions_;
  CompletionThread* completions_ = nullptr;
  std::unique_ptr<KvIndex> own_index_;
  KvIndex* index_ = nullptr;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_REGISTRY_WORKER_REGISTRY_H_
