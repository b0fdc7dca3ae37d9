// What the engine's scheduler keeps of a request while it runs: the request itself (RunningRequest:
// its stop ids, its imports' hold, what its first admission reused) and one Sequence per choice
// (its tokens, how far its KV is computed, its KV tables, its sampler and stop-string state).
//
// Plain data, owned by the Scheduler (scheduler.h) on the engine thread: thread-compatible.

#ifndef FERRY_ENGINE_SCHEDULER_SEQUENCE_H_
#define FERRY_ENGINE_SCHEDULER_SEQUENCE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "engine/common/token_id.h"
#include "engine/grammar/token_matcher.h"
#include "engine/kv/hybrid_kv_cache.h"
#include "engine/request.h"
#include "engine/sampling/sampler.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/stop_strings.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {

struct RunningRequest {
  EngineRequest r;
  PromptTokenSet prompt_set;
  Hash128 root;                              // of the block-hash chain (model, tenant salt)
  std::vector<PromptImageSpan> image_spans;  // r.images as the block hashes see them
  bool fork_pending = false;                 // choices 1..n-1 start from choice 0's prompt
  std::vector<TokenId> stop_ids;  // stop_token_ids and (unless ignore_eos) the eos ids, sorted
  int64_t live = 0;               // sequences not finished
  bool admitted_once = false;
  bool handed_off = false;           // its KV is held as a handoff (prefill-only, or parked)
  int64_t cached_prompt_tokens = 0;  // at the first admission
  // Imports: the blocks held until the first admission (r.imported_blocks, emptied then), and
  // of the cached prompt tokens, how many they supplied.
  std::vector<BlockId> pinned;
  int64_t imported_tokens = 0;
  int64_t replayed_tokens = 0;  // at the first admission
  // Its KV is an approximation (a bounded replay; or imported so): never cached or offered.
  bool approximate = false;
  int64_t window_floor = 0;     // the window layers' first key (a bounded replay's start)
  absl::Duration submitted_at;  // the engine clock's Monotonic() at Submit
  absl::Duration queued;        // submitted_at to the first admission
};

struct Sequence {
  std::shared_ptr<RunningRequest> req;
  int32_t choice = 0;
  int64_t arrival = 0;
  int64_t prompt_len = 0;
  std::vector<TokenId> tokens;  // prompt + generated
  int64_t computed = 0;         // positions whose KV is in `kv`
  KvTables kv;
  bool admitted = false;
  bool finished = false;
  std::vector<Hash128> hashes;  // of full blocks of `tokens`, as far as computed
  int64_t cached_blocks = 0;    // of `hashes`, offered to the prefix cache
  int64_t offer_from = 0;       // blocks from here on are computed here (on_computed_blocks)
  // A window replay (SWA replay): positions before replay_end leave the full-attention KV as it
  // is; the window layers see no key before window_floor.
  int64_t replay_end = 0;
  int64_t window_floor = 0;
  WindowReplay admission;  // the latest admission's cached prefix (for the first's accounting)
  SamplerState state;
  StopStringMatcher stop{{}};
  std::unique_ptr<IncrementalDetokenizer> detok;
  // The request's constraint's matcher for this choice (none without one), and its mask buffer.
  std::optional<grammar::TokenMatcher> matcher;
  std::vector<uint32_t> mask;
  int64_t step_chunk = 0;       // tokens scheduled in the current step
  int64_t reported_blocks = 0;  // stream_kv: in the latest progress event

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
  // Rank: lower runs first (higher priority, then earlier arrival).
  std::tuple<int64_t, int64_t, int32_t> rank() const {
    return {-static_cast<int64_t>(req->r.priority), arrival, choice};
  }
};

// A sequence for choice `choice` of `req` that has not produced anything yet (`tokenizer` null:
// no text).
std::unique_ptr<Sequence> NewSequence(const std::shared_ptr<RunningRequest>& req, int32_t choice,
                                      int64_t arrival, const Tokenizer* tokenizer);

// Extends `seq`'s block hashes over its full blocks up to `full` (chained from its request's
// root).
void HashFullBlocks(Sequence& seq, int64_t full, int32_t block_tokens);

}  // namespace ferry

#endif  // FERRY_ENGINE_SCHEDULER_SEQUENCE_H_
