// prefix_aware (the default policy; ARCHITECTURE.md §6): the worker that will give the prompt its
// first token soonest, from the prefix of the prompt each worker holds (the router's KV index)
// and each worker's queue and *measured* speed, so that a conversation returns to the worker
// holding it and a slow or throttled worker gets less work, not the same token count.
//
// Prefill cost of an aggregated or prefill worker w, in seconds:
//
//   (queued_w + uncached_w) / speed_w  +  store_blocks_w x store_fetch_per_block
//
//   local_w     leading blocks of the prompt w holds, as the engine will reuse them: at most
//               (prompt_tokens - 1) / block_tokens (the engine computes the last prompt token
//               again for its logits, so a block-aligned prompt's last block is recomputed);
//               for a hybrid model (max_window > 0) only as far as w's window cache also holds
//               the blocks the next position sees (the engine's rule without a replay)
//   store_w     leading blocks the KV store holds (the same limit), of which
//   store_blocks_w = max(0, store - local_w) would be read from it
//   uncached_w  prompt_tokens - max(local_w, store) x block_tokens
//   queued_w    the larger of the tokens it reported queued and those the router sent it that
//               are not computed yet (its own count, exact at once)
//   speed_w     its measured prefill tokens per second; unmeasured: the median of the
//               candidates' measurements (1 when none is measured: costs in tokens)
//
// Decode worker d (the P/D path's stream), in milliseconds per step: step_d x (1 + (active_d +
// needed) / capacity_d), with active_d the larger of its reported running + queued tokens and
// the router's own, needed the prompt tokens it does not hold, capacity_d its KV tokens, step_d
// its measured step time (unmeasured: the median of the candidates', else 1).
//
// A worker is busy when its queued work exceeds busy_threshold (prefill) or it has fewer free
// KV tokens than the request needs (decode); busy workers are chosen only when all are. Among
// costs equal to within one part in a million the choice is random. A pool that mixes
// aggregated and decode workers sends a request to an aggregated one while one is not busy (the
// two costs are not in the same unit).
//
// Thread-safe.

#ifndef FERRY_ROUTER_POLICY_PREFIX_AWARE_H_
#define FERRY_ROUTER_POLICY_PREFIX_AWARE_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "router/index/kv_index.h"
#include "router/policy/routing_policy.h"

namespace ferry {

class PrefixAwarePolicy final : public RoutingPolicy {
 public:
  // `index` must outlive the policy.
  PrefixAwarePolicy(const KvIndex* index, PrefixAwareOptions options, uint64_t seed);
  const char* name() const override { return "prefix_aware"; }
  size_t Pick(absl::Span<const WorkerLoadView> candidates, const RouteRequest& request) override {
    return Choose(candidates, request).index;
  }
  RouteChoice Choose(absl::Span<const WorkerLoadView> candidates,
                     const RouteRequest& request) override;
  int64_t CachedPositions(absl::Span<const WorkerLoadView> candidates,
                          const RouteRequest& request) const override;

  // The blocks of `chain` (at most `limit`) the worker in `view` will reuse from its memory.
  int64_t HeldPrefix(const WorkerLoadView& view, absl::Span<const Hash128> chain, int64_t matched,
                     int64_t limit, int64_t block_tokens) const;

 private:
  const KvIndex* const index_;
  const PrefixAwareOptions options_;
  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_ROUTER_POLICY_PREFIX_AWARE_H_
