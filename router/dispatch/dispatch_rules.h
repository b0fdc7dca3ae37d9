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
  int max_retries = 2;     // attempts after the first that failed before a token (all told)
  int max_migrations = 3;  // moves of a request that had sent output
  int64_t max_queued = 256;
};

// ---- Candidates ------------------------------------------------------------------------------
// `workers` are the ones that can take a request now (up, accepted, not draining, below their
// capacity: the registry's, or the simulator's, rule); the results are indices into it.

// Where `job` can stream from: aggregated workers, and decode workers while a prefill worker can
// take it too. Workers that failed the job are avoided while another of the same side (stream or
// prefill) can take it; with none left (a small pool, a worker restarted on its address) they
// get it again.
std::vector<size_t> StreamCandidates(absl::Span<const WorkerLoadView> workers,
                                     const JobRecord& job);
// The prefill workers for `job`'s P/D prefill (the same avoidance).
std::vector<size_t> PrefillCandidates(absl::Span<const WorkerLoadView> workers,
                                      const JobRecord& job);
// The workers that can take `job`'s drain hand-off: of the source's role, neither the source
// (by id or by `endpoints[i]`, the worker's Worker service address) nor one that failed the job.
// No relaxation: with none, the hand-off falls back to a re-prefill.
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
// A new request, before any attempt: refused when no worker can take requests (none up, or all
// draining) or the router stops; behind the queue unless it is empty (arrival order), refused
// when the queue is full.
Admission AdmitNew(bool any_worker_up, bool stopping, size_t queued, const DispatchLimits& limits);
// A new request no candidate could take: it waits, or is refused when the queue is full.
Admission AdmitUnstarted(size_t queued, const DispatchLimits& limits);
// A queued request that has waited until `now`: OK while it may wait on; DeadlineExceeded at its
// deadline; Unavailable when no worker can take requests at all.
absl::Status QueuedWait(const JobRecord& job, absl::Time now, bool any_worker_up);

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
  kRetry,    // start it again elsewhere under the same attempt id (no output yet)
  kMigrate,  // move it with its output so far under the next attempt id (or hand it off)
  kQueue,    // a restart found no worker: it waits at the queue's front
  kEnd,      // it ends: OnEnd(end)
};

struct Decision {
  Next next = Next::kEnd;
  // kRetry: the worker to avoid from now on (the attempt's `failed`); kMigrate: its `worker`.
  std::string exclude;
  // kMigrate: the metric's cause ("stream_broken", "worker_down", "worker_error",
  // "drain_handoff", "handoff_failed"), the output tokens carried, the attempt that stopped (to
  // Abort on its worker when it comes back) and the next attempt's hand-off (inactive: a
  // re-prefill).
  std::string cause;
  int64_t carried = 0;
  std::string stopped_attempt;
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
// already waited its turn) unless the queue is full or the router stops; then it ends with the
// attempt's status ("no_worker").
void RestartFoundNoWorker(size_t queued, bool stopping, const DispatchLimits& limits,
                          Decision* decision);

// The failure metric's cause of a request that ends with `status` before any output (or with a
// status that may not move): "deadline", "no_worker", "worker_error"; "" for the request's own
// fault (invalid, too long).
std::string FailureCause(const absl::Status& status);

}  // namespace ferry

#endif  // FERRY_ROUTER_DISPATCH_DISPATCH_RULES_H_
