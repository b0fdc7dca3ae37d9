// What the engine has done and holds (Engine::stats()): its queue, its sequences, its KV pools
// and caches, its steps. A plain value, published after every step.

#ifndef FERRY_ENGINE_ENGINE_STATS_H_
#define FERRY_ENGINE_ENGINE_STATS_H_

#include <cstdint>
#include <vector>

namespace ferry {

struct EngineStats {
  int64_t waiting = 0, running = 0;  // requests' sequences without / with KV
  // Tokens still to compute for waiting sequences (prompt, or everything after a preemption),
  // and the positions running sequences hold.
  int64_t queued_tokens = 0, running_tokens = 0;
  int64_t total_blocks = 0, free_blocks = 0;
  int64_t cached_blocks = 0, window_cached_blocks = 0;  // held by the prefix / window cache
  int64_t steps = 0, preemptions = 0;
  int64_t prompt_tokens_computed = 0, cached_tokens = 0, generated_tokens = 0;
  // Tokens the model's backend chose (greedy rows whose logits never came to the sampler).
  int64_t greedy_rows_on_backend = 0;
  // Of cached_tokens, supplied by imports; imported blocks not used (already cached, or dropped
  // under pressure before admission).
  int64_t imported_tokens = 0, unused_imported_blocks = 0;
  // First admissions of a cached prefix on a window pool: with the window blocks cached (hits),
  // replayed, or cut back to where the window cache held them (misses); positions replayed;
  // window blocks expired by their TTL.
  int64_t window_hits = 0, window_replays = 0, window_misses = 0;
  int64_t replayed_tokens = 0, window_expired_blocks = 0;
  // Requests failed because a step had to compute an image sent without rows (expected cached).
  int64_t absent_image_rows = 0;
  // Constrained sampling: token masks computed (one per token of a choice with a grammar) and
  // their time, since creation (the mean mask time per token is their ratio).
  int64_t grammar_masks = 0;
  double grammar_mask_seconds = 0;
  double busy_seconds = 0;       // in steps that ran the model, since creation
  double last_step_seconds = 0;  // the latest such step
  // Mixture-of-experts models: tokens routed to each expert, summed over the sparse layers.
  std::vector<int64_t> expert_tokens;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_ENGINE_STATS_H_
