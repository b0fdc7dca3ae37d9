// The engine: one model, one KV pool, a prefix cache and a continuous-batching scheduler, driven
// by one engine thread (ARCHITECTURE.md §4). Services submit requests and receive per-token
// events; everything else happens on the engine thread.
//
//   auto engine = Engine::Create(model, pool, tokenizer, EngineOptions{});
//   engine->Start();
//   engine->Submit({.id = "r1", .prompt = ids, .on_event = [](const TokenEvent& e) {...}});
//
// A step: the running sequences that are decoding (one token each) come first, then running
// prefills continue, then waiting requests are admitted in (priority, arrival) order while the
// step's token budget, the running limit and the free KV blocks allow, strictly in that order (a
// request that does not fit holds back the ones behind it, so a flood of short requests cannot
// starve a long one). Prefill is chunked (prefill_chunk tokens per sequence per step) and mixed
// with decodes in one Forward. Admission first takes the longest cached prefix of the request's
// chained block hashes (prompt and, after a preemption, its own output). When a running sequence
// needs a block and none is free, unreferenced cached blocks are evicted; then the sequence
// ranked last is preempted: its blocks are released and it recomputes later, continuing exactly.
//
// Determinism: a sequence's logits do not depend on what shares its steps, how its prompt was
// chunked, whether its prefix came from the cache, or whether it was preempted or resumed (the
// backend's guarantee plus position-keyed sampling), so its tokens do not either.
//
// Roles: kPrefillOnly stops after the first token and hands the KV blocks to the caller (event
// kHandoff, blocks held until ReleaseHandoff); kDecodeOnly starts from imported KV blocks of the
// prompt plus the first token (as a resume point).
//
// Hybrid models (sliding-window and full-attention layers) may run on two pools: the
// full-attention layers' (`pool`) and the window layers' (`window_pool`), where a sequence holds
// only the blocks its window still covers: after each step the window blocks no later row can see
// go back (to the window cache, below, or free), so the window pool needs about
// (window + chunk) / block_tokens + 1 blocks per running sequence whatever its length. Full blocks
// of the window layers are kept in a window cache (LRU, window_cache_bytes) under the same block
// hashes as the prefix cache; a cached prefix of k blocks is taken only when the window cache also
// holds the window layers' blocks the next row can see, otherwise the longest shorter prefix that
// has them (exact, never an approximation). Handoffs and imports carry both tables.
//
// Events are delivered on the engine thread, in order per choice; the last event of a choice
// has a finish reason and carries what a resume elsewhere needs (sampler state, held-back text).

#ifndef FERRY_ENGINE_ENGINE_H_
#define FERRY_ENGINE_ENGINE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/common/hash128.h"
#include "engine/common/token_id.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/prefix_cache.h"
#include "engine/model/transformer.h"
#include "engine/sampling/sampler.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {

enum class FinishReason { kNone, kStop, kLength, kAbort, kError, kHandoff };
const char* FinishReasonName(FinishReason reason);

enum class EngineRole { kPrefillAndDecode, kPrefillOnly, kDecodeOnly };

struct TokenEvent {
  std::string request_id;
  int32_t choice = 0;
  bool has_token = false;  // false: an event without a token (abort, error)
  TokenId token = 0;
  std::string text;   // text that became final with this token
  float logprob = 0;  // with sampling.top_logprobs >= 0
  std::vector<std::pair<TokenId, float>> top_logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string error;            // kError
  std::vector<float> logits;    // the row the token was chosen from (keep_logits)
  std::vector<BlockId> blocks;  // kHandoff: the KV of prompt + first token
  // kHandoff on a window pool: the window layers' table, indexed like `blocks`, kNoBlock for the
  // blocks before the window.
  std::vector<BlockId> window_blocks;
  // With every finish: what continuing this choice elsewhere needs (ResumePoint).
  std::string sampler_state;
  std::string held_text;
};

// A choice that already produced `generated` tokens (all already delivered to the client) and
// continues here exactly as if it had never stopped.
struct ResumePoint {
  std::vector<TokenId> generated;
  std::string sampler_state;  // SamplerState::Serialize()
  std::string held_text;      // text held back by the stop-string matcher
};

struct EngineRequest {
  std::string id;  // unique among live requests
  std::vector<TokenId> prompt;
  SamplingParams sampling;
  int32_t n = 1;  // choices, sampled with choice index 0..n-1
  int64_t max_tokens = 16;
  std::vector<TokenId> stop_token_ids;
  std::vector<std::string> stop;  // needs the engine's tokenizer
  int32_t priority = 0;           // lower runs first; then arrival
  std::string cache_salt;         // the tenant's, enters the block hashes
  EngineRole role = EngineRole::kPrefillAndDecode;
  bool keep_logits = false;
  std::vector<ResumePoint> resume;              // empty, or one per choice
  std::vector<BlockId> imported_blocks;         // kDecodeOnly: the prompt's KV (one reference each,
                                                // handed to the engine)
  std::vector<BlockId> imported_window_blocks;  // on a window pool: the window layers' table
                                                // (kNoBlock before the window)
  std::function<void(const TokenEvent&)> on_event;
};

struct EngineOptions {
  int64_t max_batch_tokens = 512;  // tokens per step
  int64_t max_running = 64;        // sequences with KV at once
  int64_t prefill_chunk = 256;     // tokens per sequence per step
  int64_t prefix_cache_bytes = int64_t{1} << 30;
  int64_t window_cache_bytes = int64_t{256} << 20;  // with a window pool
  int32_t max_n = 16;
};

struct EngineStats {
  int64_t waiting = 0, running = 0;
  int64_t steps = 0, preemptions = 0;
  int64_t prompt_tokens_computed = 0, cached_tokens = 0, generated_tokens = 0;
  // Mixture-of-experts models: tokens routed to each expert, summed over the sparse layers.
  std::vector<int64_t> expert_tokens;
};

class Engine {
 public:
  // model and pool (and tokenizer, which may be null: no text, no stop strings) must outlive the
  // engine. `pool` has the model's KvLayoutFor layout, or with `window_pool` (a hybrid model)
  // FullKvLayoutFor's, and window_pool WindowKvLayoutFor's with room for at least one sequence's
  // window (WindowBlocksPerSequence).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(Transformer* model, KvBlockPool* pool,
                                                        const Tokenizer* tokenizer,
                                                        const EngineOptions& options,
                                                        KvBlockPool* window_pool = nullptr);
  // The most window blocks one running sequence holds at once.
  static int64_t WindowBlocksPerSequence(const Transformer& model, const EngineOptions& options,
                                         int32_t block_tokens);
  ~Engine();  // stops the engine thread; live requests end with kAbort

  // Validates and queues; thread-safe. Invalid requests are an InvalidArgument and send nothing.
  absl::Status Submit(EngineRequest request);
  // Ends a request (all its choices) at the next step with kAbort; thread-safe.
  void Abort(const std::string& id);
  // Releases the blocks of a kHandoff; thread-safe.
  void ReleaseHandoff(const std::string& id);

  // The engine thread runs Step() while there is work and sleeps otherwise.
  void Start();
  void Stop();
  // One step; false when there was nothing to do. Only while the thread is not running.
  absl::StatusOr<bool> Step();

  EngineStats stats() const;
  int64_t free_blocks() const { return pool_->num_free(); }
  PrefixCache& prefix_cache() { return cache_; }
  PrefixCache* window_cache() { return window_cache_.get(); }  // null without a window pool

 private:
  struct Request;
  struct Sequence;
  struct Handoff {
    std::vector<BlockId> blocks, window_blocks;
  };

  Engine(Transformer* model, KvBlockPool* pool, const Tokenizer* tokenizer,
         const EngineOptions& options, KvBlockPool* window_pool);
  absl::Status Validate(const EngineRequest& r) const;
  void DrainInbox();
  void AddRequest(EngineRequest r);
  // Blocks so that `seq` holds `positions`; evicts cached blocks, then preempts sequences ranked
  // after `seq` (never `seq` itself); false when it still cannot.
  bool Reserve(Sequence& seq, int64_t positions, std::vector<Sequence*>& scheduled);
  void Preempt(Sequence& seq);
  // Releases a sequence's blocks in both pools.
  void ReleaseBlocks(Sequence& seq);
  void ReleaseHandoffBlocks(Handoff& handoff);
  // Takes the longest usable cached prefix; returns its tokens.
  int64_t Admit(Sequence& seq);
  // The first block of the window layers' table that the row at `position` can see.
  int64_t FirstWindowBlock(int64_t position) const;
  void CacheFullBlocks(Sequence& seq);
  // Gives back the window blocks no later row of `seq` can see.
  void Slide(Sequence& seq);
  void Deliver(Sequence& seq, absl::Span<const float> logits);
  void Fork(Sequence& first, absl::Span<const float> logits);
  void Finish(Sequence& seq, FinishReason reason, TokenEvent event);
  void Emit(const Sequence& seq, TokenEvent& event);
  void RemoveFinished();
  void Loop();

  Transformer* const model_;
  KvBlockPool* const pool_;
  const Tokenizer* const tokenizer_;
  const EngineOptions options_;
  KvBlockPool* const window_pool_;  // null: every layer in pool_
  const int32_t block_tokens_;
  PrefixCache cache_;
  std::unique_ptr<PrefixCache> window_cache_;

  // Engine-thread state.
  std::vector<std::unique_ptr<Sequence>> seqs_;  // every live sequence, in arrival order
  absl::flat_hash_map<std::string, Handoff> handoffs_;
  int64_t arrivals_ = 0;
  EngineStats stats_;
  std::vector<float> logits_;

  // Inbox, filled by other threads.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<EngineRequest> submitted_;
  std::vector<std::string> aborted_, released_;
  absl::flat_hash_set<std::string> live_ids_;
  bool stopping_ = false;
  std::thread thread_;
  EngineStats published_;  // stats_ as of the last step, under mu_
};

}  // namespace ferry

#endif  // FERRY_ENGINE_ENGINE_H_
