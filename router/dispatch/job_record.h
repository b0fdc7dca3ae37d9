// What the router knows of one request while it runs (ARCHITECTURE.md §6, §7): the job record
// the dispatch rules (dispatch_rules.h) decide on, with no RPC types in it, so the router's
// dispatcher and the simulator (tools/sim) keep the same record and apply the same rules.
//
// The record holds the request's route (prompt, block hashes), its attempts and the workers that
// failed it, its migrations and drain hand-off, and what its client received of each choice (the
// resume point of a migration), within tracking caps.
//
// Thread-compatible: its owner guards it (the router: the dispatcher's mutex, and its progress
// mutex for `progress`, `tracked` and `tracked_tokens`).

#ifndef FERRY_ROUTER_DISPATCH_JOB_RECORD_H_
#define FERRY_ROUTER_DISPATCH_JOB_RECORD_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "router/policy/routing_policy.h"

namespace ferry {

// What the client received of one choice.
struct ChoiceProgress {
  std::vector<uint32_t> tokens;
  std::string tail;  // the stop-string tail the worker held back after them
  bool finished = false;
};

// The running (or next) attempt is a drain hand-off: from the worker `source` that stopped the
// request's attempt `request_id`, whose Worker service is at `endpoint` ("host:port"), to a worker
// of `role`. No hand-off while `endpoint` is empty.
struct HandoffPlan {
  std::string endpoint;
  std::string source;
  std::string request_id;
  WorkerKind role = WorkerKind::kAggregated;

  bool active() const { return !endpoint.empty(); }
};

struct JobRecord {
  // The request.
  std::string request_id;  // the client's; the first attempt's
  absl::Time deadline = absl::InfiniteFuture();
  int64_t prompt_tokens = 0;
  int32_t choices = 1;                // n (at least 1)
  std::vector<Hash128> block_hashes;  // the prompt's full blocks
  int64_t block_tokens = 0;
  int64_t store_prefix_blocks = 0;  // leading blocks the KV store holds (0: none or unknown)

  // Its life so far.
  int attempts = 0;                // started, retries and migrations included
  int retries = 0;                 // restarts before a token (against max_retries)
  int collisions = 0;              // attempts a worker refused as already running (router bugs)
  std::set<std::string> excluded;  // workers that failed it (avoided while another can take it)
  bool queued = false;
  // The queue (dispatch_rules.h EnterQueue): when it last entered it (InfiniteFuture: not in
  // it), and its earlier stays there since its last token (or its arrival). The queue's timeout
  // counts all of them, so a request refused again and again (KV pressure) waits at most that
  // long in all; the time its attempts ran does not count.
  absl::Time queued_at = absl::InfiniteFuture();
  absl::Duration waited;
  // KV pressure: a decode worker refused it for want of KV blocks. It waits for a decode worker
  // whose Watch shows `kv_blocks_needed` blocks free (or held by its prefix cache, which gives
  // them up); one that refused it must have reported its load again since (`kv_refused`: its
  // report count at the refusal), so a stale report never makes it ask again at once.
  int64_t kv_blocks_needed = 0;
  std::map<std::string, uint64_t> kv_refused;
  bool cancelled = false;  // the client went away
  bool ended = false;      // its end was decided (OnEnd delivered or on its way)
  int migrations = 0;
  int64_t resumed_tokens = 0;  // output tokens (all choices) before the running attempt
  HandoffPlan handoff;
  // The worker asked to pre-copy the running attempt's KV when its worker began draining
  // (Dispatcher: handoff_planned): the hand-off goes there if it can take it.
  std::string precopy_target;
  WorkerKind role = WorkerKind::kAggregated;  // the running attempt's worker's

  // What the client received (the resume point of a migration).
  std::vector<ChoiceProgress> progress;
  bool tracked = true;         // false: over a cap, or inconsistent (cannot migrate)
  int64_t tracked_tokens = 0;  // counted in its owner's total

  // The running (last started) attempt's request id, distinct for every attempt on every worker:
  // the client's for the first, then "<id>.a2", "<id>.a3", ... (retries, migrations and drain
  // hand-offs alike), so a worker still running an abandoned attempt never meets its id again.
  std::string AttemptId() const;
  // What the routing policy knows of the request (the output so far is re-prefilled too).
  RouteRequest Route() const;
  // The prompt tokens the chosen worker computes, as the policy expects it.
  int64_t Uncached(const RouteChoice& choice) const;
  // Every choice was received to its end.
  bool AllChoicesFinished() const;
  // Output tokens received, all choices.
  int64_t ReceivedTokens() const;
};

// Caps on what a router keeps of its requests' output.
struct TrackingLimits {
  int64_t max_tokens_per_request = 65536;
  int64_t max_tokens = 16 << 20;
};

// A chunk of one choice the client received.
struct ReceivedChunk {
  uint32_t choice = 0;
  uint64_t first_output_index = 0;
  absl::Span<const uint32_t> token_ids;
  std::string tail;
  bool finished = false;
};

enum class TrackResult {
  kAdded,
  kNotTracked,    // the record stopped tracking earlier: nothing kept
  kOverCap,       // over a cap: the record stops tracking now
  kInconsistent,  // the chunk does not continue the record: it stops tracking now
};

// Adds `chunk` to `job`'s record; `total_tracked` is the owner's total of tracked tokens, which
// `*delta` gets the change of (negative when the record stops tracking and lets go of its tokens).
TrackResult Track(JobRecord* job, const ReceivedChunk& chunk, int64_t total_tracked,
                  const TrackingLimits& limits, int64_t* delta);
// The record lets go of its output (its end); returns the tokens leaving the owner's total.
int64_t Untrack(JobRecord* job);

}  // namespace ferry

#endif  // FERRY_ROUTER_DISPATCH_JOB_RECORD_H_
