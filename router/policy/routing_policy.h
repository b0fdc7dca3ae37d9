// The routing policy seam (STYLE.md §3; ARCHITECTURE.md §6): which of the workers that can take a
// request now gets it. The registry and the dispatcher decide who is a candidate (up, accepted
// into the pool, not draining, below its capacity); a policy only chooses among them.
//
//   round_robin   in turn, skipping none
//   least_loaded  the fewest requests in flight (the router's own count, exact at once), then the
//                 fewest tokens queued and running as the worker last reported, ties at random
//   prefix_aware  (the default) the cost model of prefix_aware.h: the prompt's prefix each worker
//                 holds (the router's KV index), its queue and its measured speed
//
// Thread-safe implementations (the dispatcher calls Pick from several threads).

#ifndef FERRY_ROUTER_POLICY_ROUTING_POLICY_H_
#define FERRY_ROUTER_POLICY_ROUTING_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"

namespace ferry {

class KvIndex;

enum class WorkerKind { kAggregated, kPrefill, kDecode };

// What a policy knows of one candidate.
struct WorkerLoadView {
  std::string id;
  WorkerKind kind = WorkerKind::kAggregated;
  int slot = -1;              // the worker's slot in the KV index (-1: none)
  int64_t inflight = 0;       // requests the router has running there
  int64_t queued_tokens = 0;  // as the worker last reported
  int64_t running_tokens = 0;
  int64_t free_kv_blocks = 0;
  int64_t total_kv_blocks = 0;   // 0: not reported
  int64_t cached_kv_blocks = 0;  // held by its prefix cache (evictable unless in use)
  uint64_t load_reports = 0;     // its last load report's stamp (a later report: a larger one)
  // Prompt tokens of streams the router started on it since its last load report (their KV is
  // not in free_kv_blocks yet).
  int64_t unreported_kv_tokens = 0;
  // The router's own, exact at once (the reports lag): prompt tokens it sent there that are not
  // computed yet (until the first token, or the end of the prefill call), and prompt tokens of
  // its streams running there (decode workers).
  int64_t pending_prefill_tokens = 0;
  int64_t active_tokens = 0;
  // Measured by the worker over its recent window; 0: not measured yet (the router keeps the
  // last measurement through idle windows).
  double prefill_tokens_per_second = 0;
  double step_time_ms = 0;
  int64_t max_window = 0;  // sliding-window layers' window, in tokens (0: none)
};

// What a policy knows of the request.
struct RouteRequest {
  int64_t prompt_tokens = 0;
  // The prompt's full blocks' chained hashes (block_hash.h), and the block size.
  absl::Span<const Hash128> block_hashes;
  int64_t block_tokens = 0;
  // Leading blocks of the prompt the shared KV store holds (0: none, or no store).
  int64_t store_prefix_blocks = 0;
};

// Leading full blocks of a prompt an engine can reuse: the prompt's last token is always computed
// (its logits give the first output token), so a block-aligned prompt's last block is not.
inline int64_t ReusableBlocks(int64_t prompt_tokens, int64_t block_tokens) {
  return block_tokens > 0 && prompt_tokens > 0 ? (prompt_tokens - 1) / block_tokens : 0;
}

// A decision, with what it expects: the prompt tokens the chosen worker will reuse from its
// memory and read from the store (prefix_aware; 0 from the others), why, and the cost terms
// (for the debug log and the prediction metrics).
struct RouteChoice {
  size_t index = 0;
  int64_t predicted_local_tokens = 0;
  int64_t predicted_store_tokens = 0;
  const char* reason = "";  // prefix_hit, store_hit, least_cost, all_busy; the policy's name
  double cost = 0;
};

class RoutingPolicy {
 public:
  virtual ~RoutingPolicy() = default;
  virtual const char* name() const = 0;
  // The index of the chosen candidate; `candidates` is not empty.
  virtual size_t Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest& request) = 0;
  // Pick with what the policy expects of it (what the dispatcher calls).
  virtual RouteChoice Choose(absl::Span<const WorkerLoadView> candidates,
                             const RouteRequest& request) {
    RouteChoice choice;
    choice.index = Pick(candidates, request);
    choice.reason = name();
    return choice;
  }
  // The leading prompt positions that a candidate computing prompts (aggregated, prefill) holds
  // in its memory, most over the candidates, less the window a hybrid model may replay below
  // them: positions no step there should compute (the router sends an image inside them without
  // rows: PromptImage.expect_cached). A prediction (the index lags; the choice may fall on
  // another worker); a miss costs a retry. Policies without an index predict none (0).
  virtual int64_t CachedPositions(absl::Span<const WorkerLoadView> candidates,
                                  const RouteRequest& request) const {
    return 0;
  }
};

struct PrefixAwareOptions {
  // A worker whose queue holds more than this much prefill work (its queued tokens over its
  // measured speed) is busy: it gets a request only when every candidate is busy, however much
  // of the prompt it holds.
  absl::Duration busy_threshold = absl::Seconds(4);
  // Reading one block from the KV store, in the cost model.
  absl::Duration store_fetch_per_block = absl::Microseconds(500);
};

// "round_robin", "least_loaded" or "prefix_aware" (which needs `index`: the router's KV index,
// which must outlive the policy); InvalidArgument for another name.
absl::StatusOr<std::unique_ptr<RoutingPolicy>> NewRoutingPolicy(
    const std::string& name, uint64_t seed = 0, const KvIndex* index = nullptr,
    PrefixAwareOptions prefix_options = {});

}  // namespace ferry

#endif  // FERRY_ROUTER_POLICY_ROUTING_POLICY_H_
