// The dispatcher's rules (ARCHITECTURE.md §6 admission, §7 failure), as pure functions over a
// job record (job_record.h) and what the caller tells them: which workers can take a request,
// whether a new request starts, waits or is refused, and what happens when an attempt ends:
// retry elsewhere, migrate with the output so far, hand off a drained request's KV, fail, or wait
// at the queue's front. The router's dispatcher (dispatcher.h) applies them around its gRPC
// calls; the simulator (tools/sim/cluster_sim.h) applies the same ones in virtual time.
//
// Nothing here reads a clock or takes a lock: `now` is an argument. Stateless; thread-safe.

#ifndef FERRY_ROUTER_DISPATCH_DISPATCH_RULES_H_
#define FERRY_ROUTER_DISPATCH_DISPATCH_RULES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "router/dispatch/job_record.h"
#include "router/policy/routing_policy.h"

namespace ferry {

struct DispatchLimits {
  int max_retries = 2;     // restarts before a first token after a worker failed the request
  int max_migrations = 3;  // moves of a request that had sent output
  // Requests waiting in the queue, and their prompt tokens (0: no token bound): a new request
  // finding either reached is refused (429). Requests that were running and must start again (a
  // retry, a migration, KV pressure) wait there too, at the front, even beyond them: each running
  // request has at most one entry, so they are bounded by what runs, and a request that already
  // started is never failed for a full queue.
  int64_t max_queued = 256;
  int64_t max_queued_tokens = 0;
  // The longest a request waits for a worker in all (from its arrival, or its last token), or
  // until its own deadline when that comes first; then it fails with 503.
  absl::Duration queue_timeout = absl::Seconds(30);
  // Attempts a worker refused as already running (an attempt id the router reused: its own bug),
  // each restarted under a new id without counting as a retry, before the request fails.
  int max_collisions = 3;
};

// ---- Candidates ------------------------------------------------------------------------------
// `workers` are the ones that can take a request now (up, accepted, not draining, below their
// capacity: the registry's, or the simulator's, rule); the results are indices into it.

// Where `job` can stream from: aggregated workers, and decode workers while a prefill worker can
// take it too. Workers that failed the job are avoided while another of the same side (stream or
// prefill) can take it; with none left (a small pool, a worker restarted on its address) they
// get it again. Decode workers stream it only while they may have room for its KV (KvRoom): the
// request waits for room in the queue, in arrival order, rather than be refused.
std::vector<size_t> StreamCandidates(absl::Span<const WorkerLoadView> workers,
                                     const JobRecord& job);
// Whether decode worker `w` may have room for `job`'s KV (its prompt and output so far, or what
// a refusal said it needed, whichever is more): its last report shows that many blocks free or
// held by its prefix cache (which gives them up), less those of the streams the router started
// there since; and when it refused the job itself, it reported again since. Optimistic (the
// cache's blocks may be in use): the worker's reservation has the last word.
bool KvRoom(const WorkerLoadView& w, const JobRecord& job);
// The prefill workers for `job`'s P/D prefill (the same avoidance).
std::vector<size_t> PrefillCandidates(absl::Span<const WorkerLoadView> workers,
                                      const JobRecord& job);
// The workers that can take `job`'s drain hand-off: of the source's role, neither the source
// (by id or by `endpoints[i]`, the worker's Worker service address) nor one that failed the job.
// No relaxation: with none, the hand-off falls back to a re-prefill. When the job's
// precopy_target is among them, only it: it holds the KV pre-copied while the source drained.
std::vector<size_t> HandoffTargets(absl::Span<const WorkerLoadView> workers,
                                   absl::Span<const std::string> endpoints, const JobRecord& job);

// ---- Admission -------------------------------------------------------------------------------

enum class Admit {
  kStart,   // try to start it now
  kQueue,   // it waits at the queue's back
  kReject,  // the status says why (Unavailable: 503; ResourceExhausted: 429)
};
struct Admission {
  Admit what = Admit::kStart;
  absl::Status status;
};
// A new request of `tokens` prompt tokens, before any attempt: refused when the router stops;
// behind the queue unless it is empty (arrival order); refused (429) when the queue holds
// max_queued new requests or its tokens would pass max_queued_tokens. (No worker up is no
// reason to refuse: the request waits for one, up to the queue's timeout.)
Admission AdmitNew(bool stopping, int64_t queued, int64_t queued_tokens, int64_t tokens,
                   const DispatchLimits& limits);
// A new request no candidate could take: it waits, or is refused as AdmitNew says.
Admission AdmitUnstarted(bool stopping, int64_t queued, int64_t queued_tokens, int64_t tokens,
                         const DispatchLimits& limits);

// `job` enters the queue at `now`.
void EnterQueue(JobRecord* job, absl::Time now);
// `job` leaves the queue at `now` (to start, or to end); returns how long it has waited there in
// all since its last token (a request refused and queued again counts its earlier stays too).
absl::Duration LeaveQueue(JobRecord* job, absl::Time now);

// The pool a request waited for in the queue (ferry_router_queue_wait_seconds{pool}): once a
// worker took it (`started`), that worker's kind (a P/D request's stream is its decode
// worker's); one that left without a worker, the pool that could not take it: with decode
// workers about, "prefill" when no prefill worker could take it, else "decode"; without them
// "aggregated".
const char* QueuePool(absl::Span<const WorkerLoadView> workers, const JobRecord& job, bool started);

// Why the requests wait, for their error: "none_up" (no worker can take requests: none up, or all
// draining), "kv" (no decode worker has room for its KV), "busy" (every worker is at its
// capacity).
std::string WaitCause(const JobRecord& job, bool any_worker_up);
// A queued request's expiry: when it has waited queue_timeout in all (JobRecord::waited and this
// stay), or reached
// its deadline, it fails with 503 (Unavailable) saying why it waited (`wait_cause`). `reason`:
// "queue_timeout" or "deadline" (the metric's); empty while it may wait on.
struct QueueExpiry {
  std::string reason;
  absl::Status status;
  bool expired() const { return !reason.empty(); }
};
QueueExpiry QueuedWait(const JobRecord& job, absl::Time now, const std::string& wait_cause,
                       const DispatchLimits& limits);

// ---- After an attempt ------------------------------------------------------------------------

// How an attempt ended, as its caller saw it.
struct AttemptOutcome {
  std::string worker;      // the worker the request streamed from
  std::string failed;      // the worker to avoid on a retry (the stream's, or the prefill worker's)
  absl::Status status;     // OK, or why the attempt ended
  bool started = false;    // a token arrived in this attempt
  bool retryable = false;  // (not OK) another worker may succeed where this one failed
  // Why a stream that sent tokens may continue elsewhere (MigrationCause); "": it may not.
  std::string migrate_cause;
  // The worker ended the stream with an error event (held back from the client until the end is
  // decided); `handoff_endpoint`: the one it names (a draining worker keeping the KV).
  bool error_event = false;
  std::string handoff_endpoint;
  // The P/D prefill worker the attempt used ("": none), told to Abort an abandoned attempt.
  std::string prefill_worker;
  // A decode worker refused the attempt for want of KV (its error event said so): the blocks it
  // needed, and that worker's load report count when the refusal was seen (the caller's).
  int64_t kv_blocks_needed = 0;
  uint64_t kv_reports = 0;
};

// A worker's failure with `code` may succeed on another worker (unreachable, full, draining); a
// worker marks other failures retryable in its error event.
bool RetryableCode(absl::StatusCode code);

// Why a stream that failed may continue elsewhere: "worker_down" (the registry found its worker
// down), "stream_broken" (the stream broke, no error event), "worker_error" (the worker failed
// it); "" for a failure that must not move (the client left, the request is invalid or past its
// deadline). `code` is a gRPC status code's number (absl's are the same numbers).
std::string MigrationCause(bool worker_down, bool error_event, absl::StatusCode code);

enum class Next {
  kRetry,    // start it again elsewhere (no output yet)
  kMigrate,  // move it with its output so far (or hand it off)
  kQueue,    // it waits at the queue's front (KV pressure, or a restart found no worker)
  kEnd,      // it ends: OnEnd(end)
};

struct Decision {
  Next next = Next::kEnd;
  // kRetry: the worker to avoid from now on (the attempt's `failed`; "" for a collision);
  // kMigrate: its `worker`.
  std::string exclude;
  // kRetry: a collision (the worker refused the attempt id as running), not counted as a retry.
  bool collision = false;
  // kQueue for KV pressure: the decode worker that refused, its report count and the blocks.
  std::string kv_refused_by;
  uint64_t kv_reports = 0;
  int64_t kv_blocks_needed = 0;
  // The attempt produced a token: the request's wait (the queue's timeout) starts afresh.
  bool progressed = false;
  // kRetry, kMigrate and kQueue: the attempt left behind, to Abort on every worker it touched
  // (the stream's, unless a hand-off keeps its KV there; the prefill worker).
  std::string stopped_attempt;
  std::vector<std::string> abort_on;
  // kMigrate: the metric's cause ("stream_broken", "worker_down", "worker_error",
  // "drain_handoff", "handoff_failed"), the output tokens carried, the attempt that stopped (to
  // Abort on its workers) and the next attempt's hand-off (inactive: a re-prefill).
  std::string cause;
  int64_t carried = 0;
  HandoffPlan handoff;
  // When it ends: what with, the failure metric's cause ("" none: it completed, the client left,
  // or the request was at fault), and whether the attempt's held error event goes to the client
  // first.
  absl::Status end;
  std::string failure;
  bool show_error_event = false;
  // This attempt was a drain hand-off that ended before a new token: "fell_back" (it migrates),
  // "completed" (every choice had ended), "failed"; "" otherwise, or when the client left.
  std::string handoff_outcome;
  std::string handoff_source;  // this attempt's hand-off source, for logs ("" none)
};

// What happens after `outcome` ends `job`'s running attempt at `now`.
//   - Queue (KV pressure): a decode worker refused it for want of KV before its first token, and
//     the client is still there before its deadline: it waits for a decode worker with room,
//     neither counted as a retry nor excluding that worker.
//   - Collision: a worker refused the attempt as already running (ALREADY_EXISTS: the router
//     reused an attempt id, its own bug): a retry under the next id, not counted, at most
//     max_collisions times; never passed to the client as such (it ends with Internal).
//   - Retry: it failed before its first token, retryably, within max_retries and the deadline,
//     and the client is still there (not a hand-off attempt, and not a drain stop of a request
//     that had output: those migrate).
//   - Migrate: it failed after output (this attempt's or an earlier one's) for a cause that may
//     move, the record is tracked, single-choice, below max_migrations and before its deadline;
//     a drain stop naming its endpoint hands it off when there is output to continue from.
//     A stream that failed after every choice had ended just ends (only the usage was lost).
//   - Otherwise it ends with the attempt's status (a failure after output says why it could not
//     move on).
Decision DecideAfterAttempt(const JobRecord& job, const AttemptOutcome& outcome,
                            const DispatchLimits& limits, absl::Time now);

// Applies a retry or migration decision to the record: the exclusion, the migration count, the
// output carried, the next hand-off. (Every decision ends the attempt's hand-off.)
void ApplyDecision(const Decision& decision, JobRecord* job);

// A retry or migration found no worker to start on: the request waits at the queue's front (it
// already waited its turn; beyond the queue's bounds, see DispatchLimits) unless the router
// stops; then it ends with the attempt's status ("no_worker").
void RestartFoundNoWorker(bool stopping, Decision* decision);

// The failure metric's cause of a request that ends with `status` before any output (or with a
// status that may not move): "deadline", "no_worker", "worker_error"; "" for the request's own
// fault (invalid, too long).
std::string FailureCause(const absl::Status& status);

}  // namespace ferry

#endif  // FERRY_ROUTER_DISPATCH_DISPATCH_RULES_H_
