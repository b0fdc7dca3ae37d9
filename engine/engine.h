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
// Roles (prefill/decode disaggregation, ARCHITECTURE.md §3):
// - kPrefillOnly computes the prompt (and a resumed choice's tokens) and samples each choice's
//   first token from the same logits, then ends: a choice whose first token does not finish it
//   ends with kHandoff, and the request's KV blocks (the positions computed: the prompt, plus a
//   resumed choice's tokens before its last; not the first token, whose KV nobody computed yet)
//   are held for the caller to send: every kHandoff event of the request names the same table.
//   They are held until ReleaseHandoff, Abort, or handoff_ttl after the handoff, whichever comes
//   first; the id stays live until then. With n > 1 the choices share the prompt's KV.
//   With stream_kv, every step that completes blocks of the prompt before its last chunk also
//   sends a progress event (choice 0, no token, no finish) naming the leading blocks of the
//   table whose KV is complete: a caller may send them while the rest is computed. They stay
//   the request's only while it runs (a preempted prompt recomputes into other blocks, the same
//   bytes), so a caller that reads them later takes its own reference (KvBlockPool::AddRef)
//   from inside the callback.
// - kDecodeOnly starts from imported KV blocks and one resume point per choice to run (their
//   first tokens, from the prefill side): the blocks cover the prompt and every generated token
//   but the last (prompt_len + generated - 1 positions). With more than one choice every choice
//   resumes after exactly one token and they share the prompt's blocks (the partial last block
//   is copied per choice; without a free block a choice recomputes instead, exactly).
//
// Hybrid models (sliding-window and full-attention layers) may run on two pools: the
// full-attention layers' (`pool`) and the window layers' (`window_pool`), where a sequence holds
// only the blocks its window still covers: after each step the window blocks no later row can see
// go back (to the window cache, below, or free), so the window pool needs about
// (window + chunk) / block_tokens + 1 blocks per running sequence whatever its length. Full blocks
// of the window layers are kept in a window cache (LRU, window_cache_bytes) under the same block
// hashes as the prefix cache; a cached prefix of k blocks is taken only when the window cache also
// holds the window layers' blocks the next row can see, otherwise the longest shorter prefix that
// has them, or, when that is cheaper, the whole prefix with a replay (below). Handoffs and
// imports carry both tables.
//
// SWA replay (ARCHITECTURE.md §4; two pools only). The window layers' KV is never imported (a KV
// store holds the full-attention layers' only), and the window cache keeps its blocks for
// window_cache_ttl after their last use. A cached prefix of k blocks whose window blocks are gone
// is still usable: its last positions are run through the whole model again, the full-attention
// layers reading their KV from the cache (and writing none), the window layers rebuilding theirs
// from the replay's start (they see no key before it). In exact mode (the default) the replay
// is model.exact_replay_tokens() positions, after which every window layer's KV the next row
// sees is exactly what a run from position 0 computes: the output is bit-identical to an
// uncached run. In bounded mode it is swa_replay_tokens positions (when fewer than exact): the
// window layers see a shorter history, the request's KV is an approximation, and nothing it
// computes is ever cached or offered (TokenEvent::approximate_kv; its window floor travels with
// a handoff, so a decode side sees the same history). The engine replays when that computes
// fewer positions than the longest window-cached shorter prefix would leave.
//
// Imports (a KV store's blocks). A prefill or aggregated request may bring the KV of its prompt's
// leading full blocks (imported_blocks, in blocks ReserveImport gave): the engine offers them to
// its prefix cache under the request's block hashes and holds them until the request is first
// admitted, which takes its cached prefix as usual. Under KV pressure the holds of requests still
// waiting are dropped first (the blocks stay cached, evictable). Events say how many of the
// prompt's tokens were reused (cached_tokens, a prefix: blocks before cached_tokens /
// block_tokens reused, the rest computed), how many of those the import supplied
// (imported_tokens) and how many positions a window replay recomputed (replayed_tokens). The full
// blocks a request computes are offered to on_computed_blocks as they complete (to write them to
// a store), never those it reused or imported.
//
// The service contract (what a worker may rely on):
// - Threads. Submit, Abort, ReleaseHandoff, Reserve, ReserveImport, ClearPrefixCache, stats()
//   and kv_events() are thread-safe. Everything else runs on the engine thread (the one Start()
//   creates, or the caller of Step() in tests): the scheduler, the model, the prefix caches.
//   Nobody else touches the caches; what a service needs of them goes through the inbox
//   (Reserve, ReserveImport, ClearPrefixCache) or the journal (kv_events(): snapshots, events,
//   prefix lookups).
// - Callbacks. on_event, on_computed_blocks, Reserve's and ReserveImport's `done` and
//   EngineOptions::on_step run on the engine thread, in order per choice, and must not block
//   (hand work to another thread; a callback that waits stalls every request). A callback may
//   call Submit, Abort or ReleaseHandoff.
// - Events. A choice's events carry its tokens in output order; its last event has a finish
//   reason and what a resume elsewhere needs (sampler state, held-back text). A request that
//   Submit accepted always ends with a finish event for each choice (kAbort when the engine is
//   destroyed first).
// - Ownership. A request's imported_blocks (and imported_window_blocks) carry one reference
//   each: accepted by Submit, the engine owns them and releases them when the request ends (or,
//   not decode-only, at its first admission); refused, the caller still owns them. Blocks a
//   service releases on the pool from another thread wake an engine that was waiting for blocks
//   (KvBlockPool::SetFreeListener).
// - Bounds. At most max_running sequences hold KV; at most max_queued requests wait (submitted
//   and not yet admitted: Submit answers ResourceExhausted beyond that); the prefix caches hold at
//   most their byte caps of unreferenced blocks; the journal at most its capacity of events.
//   Per request: n <= max_n, max_tokens and the prompt within the model's positions.
// - Stops. A choice stops on the request's stop_token_ids, on the model's end-of-sequence ids
//   (ModelConfig::eos_token_ids and the tokenizer's eos) unless ignore_eos, or on a stop string;
//   before min_tokens output tokens none of them can end it (stop and end-of-sequence ids are not
//   sampled; stop strings must end in a later token's text).

#ifndef FERRY_ENGINE_ENGINE_H_
#define FERRY_ENGINE_ENGINE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "engine/common/token_id.h"
#include "engine/engine_stats.h"
#include "engine/handoff_book.h"
#include "engine/kv/hybrid_kv_cache.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/kv_event_journal.h"
#include "engine/kv/prefix_cache.h"
#include "engine/model/forward_model.h"
#include "engine/request.h"
#include "engine/sampling/sampler.h"
#include "engine/scheduler/scheduler.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {

struct EngineOptions {
  int64_t max_batch_tokens = 512;  // tokens per step
  int64_t max_running = 64;        // sequences with KV at once
  int64_t max_queued = 1024;       // requests waiting for admission; Submit refuses more
  int64_t prefill_chunk = 256;     // tokens per sequence per step
  int64_t prefix_cache_bytes = int64_t{1} << 30;
  int64_t window_cache_bytes = int64_t{256} << 20;  // with a window pool
  // With a window pool: the window cache's blocks expire this long after their last use (zero:
  // never); SWA replay mode and the bounded mode's positions.
  absl::Duration window_cache_ttl = absl::Seconds(180);
  enum class SwaReplay { kExact, kBounded };
  SwaReplay swa_replay = SwaReplay::kExact;
  int64_t swa_replay_tokens = 128;
  int32_t max_n = 16;
  size_t journal_events = KvEventJournal::kDefaultCapacity;  // kv_events()' bound
  // A handoff nobody released is released this long after it was made (a prefill worker whose
  // push never ended). Longer than any transfer deadline: a transfer may read the blocks until
  // then.
  absl::Duration handoff_ttl = absl::Seconds(60);
  // Time for handoff_ttl; null: RealClock(). Must outlive the engine.
  Clock* clock = nullptr;
  // After every step that ran the model, on the engine thread; must not block.
  std::function<void(const StepInfo&)> on_step;
  // After every pass of the engine thread's loop (each Step(), whether or not it ran the model),
  // on that thread, once the pass's events were delivered: a service sends what they queued
  // (the worker's token streams). Must not block.
  std::function<void()> on_pass;
};

class Engine {
 public:
  // model and pool (and tokenizer, which may be null: no text, no stop strings) must outlive the
  // engine. `pool` has the model's KvLayoutFor layout, or with `window_pool` (a hybrid model)
  // FullKvLayoutFor's, and window_pool WindowKvLayoutFor's with room for at least one sequence's
  // window (WindowBlocksPerSequence).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(ForwardModel* model, KvBlockPool* pool,
                                                        const Tokenizer* tokenizer,
                                                        const EngineOptions& options,
                                                        KvBlockPool* window_pool = nullptr);
  // The most window blocks one running sequence holds at once.
  static int64_t WindowBlocksPerSequence(const ForwardModel& model, const EngineOptions& options,
                                         int32_t block_tokens);
  ~Engine();  // stops the engine thread; live requests end with kAbort

  // Validates and queues; thread-safe. Invalid requests are an InvalidArgument, a duplicate live
  // id AlreadyExists, a full queue (max_queued) ResourceExhausted; then nothing is sent.
  absl::Status Submit(EngineRequest request);
  // The checks Submit makes of `request` itself (InvalidArgument); thread-safe. A service that
  // submits later (a decode worker, once the KV arrived) refuses a bad request before any work.
  absl::Status Validate(const EngineRequest& request) const;
  // Ends a request (all its choices) at the next step with kAbort, or releases its handoff;
  // thread-safe. Unknown or finished ids are ignored, so it is idempotent.
  void Abort(const std::string& id);
  // Releases the blocks of a kHandoff; thread-safe. (Abort(id) does it too.)
  void ReleaseHandoff(const std::string& id);
  // Stops a decoding request at a step boundary and keeps its KV for the caller to send
  // elsewhere (a drain's hand-off); thread-safe. A request of one choice ends with kHandoff at the
  // first step boundary where it is admitted and between tokens (every position but its last
  // token's computed; one still prefilling or preempted gets there later): the event names its
  // table (blocks covering prompt + generated - 1 positions, held as a prefill-only request's
  // are: until ReleaseHandoff, Abort or handoff_ttl) and carries its sampler state and held-back
  // text, so that a decode-only request elsewhere continues it exactly. A request of several
  // choices is never parked: it runs on until it ends or Abort ends it. Unknown or finished ids
  // are ignored.
  void Park(const std::string& id);
  // Whether `id` is submitted and not yet finished (or a handoff not yet released). False from
  // the moment the request's last finish event is emitted.
  bool IsLive(const std::string& id) const;

  // Reserves the blocks for `positions` positions of a request whose KV will arrive from
  // elsewhere (a decode worker's reservation, a KV store load), at the next step: the longest
  // cached prefix of `hashes` (chained block hashes of the request's full blocks, as the engine
  // computes them: block_hash.h with the model fingerprint and the tenant's salt; prefix blocks
  // taken with a reference each), then fresh blocks, evicting unreferenced cached blocks as
  // needed. `done` runs once on the engine thread with the blocks, or ResourceExhausted when the
  // pool cannot supply them (nothing held then). The caller owns the blocks: it passes them to a
  // decode-only request or releases them on the pool(s).
  void Reserve(std::vector<Hash128> hashes, int64_t positions,
               std::function<void(absl::StatusOr<KvReservation>)> done);
  // Blocks to import the KV of a prefix into (a KV store's read), at the next step: the longest
  // cached prefix of `hashes` (a reference each), then fresh blocks for the rest of `hashes`, in
  // the full-attention pool only, evicting unreferenced cached blocks as needed but never taking
  // more than `max_fresh` blocks (more: the reservation stops short). `done` runs once on the
  // engine thread with the blocks (KvReservation::cached_blocks the cached ones; window_blocks
  // empty), or ResourceExhausted when not one fresh block was free. The caller owns the blocks:
  // it passes them to a request (imported_blocks) or releases them on the pool.
  void ReserveImport(std::vector<Hash128> hashes, int64_t max_fresh,
                     std::function<void(absl::StatusOr<KvReservation>)> done);
  // Takes a reference on the first `blocks` blocks of running request `id`'s table (the
  // full-attention pool's), at the next step: the KV a drain pre-copies while the request goes
  // on (full blocks, all positions computed, never written again). `done` runs once on the
  // engine thread with them (the caller releases them on the pool), or NotFound (no such request
  // running), FailedPrecondition (several choices, or fewer than blocks x block_tokens positions
  // computed).
  void HoldComputedBlocks(const std::string& id, int64_t blocks,
                          std::function<void(absl::StatusOr<std::vector<BlockId>>)> done);
  // Offers full blocks whose KV came from elsewhere (ReserveImport's, once written: a drain
  // pre-copy) to the prefix cache under their chained `hashes`, at the next step, and drops the
  // caller's reference on each (one already cached under its hash keeps the cached block).
  void CacheBlocks(std::vector<Hash128> hashes, std::vector<BlockId> blocks);
  // Evicts every unreferenced block of the prefix (and window) cache at the next step (blocks
  // running requests use stay); thread-safe.
  void ClearPrefixCache();

  // The engine thread runs Step() while there is work and sleeps otherwise.
  void Start();
  void Stop();
  // One step; false when there was nothing to do. Only while the thread is not running.
  absl::StatusOr<bool> Step();

  // As of the last step; thread-safe.
  EngineStats stats() const;
  int64_t free_blocks() const { return kv_.pool().num_free(); }
  // What the prefix caches hold, as events and snapshots; thread-safe.
  const KvEventJournal& kv_events() const { return journal_; }
  // The ids the engine stops on unless a request ignores end of sequence.
  const std::vector<TokenId>& eos_token_ids() const { return eos_ids_; }
  const ForwardModel& model() const { return *model_; }
  // The tokenizer's vocabulary as a token trie, what constraints are compiled for
  // (CompiledConstraint::Create), for a request that keeps `kept_special` as text
  // (EngineRequest::keep_special_token_ids): those special tokens have their text as bytes, so a
  // grammar can produce them (a tool-call marker); other special tokens have none. Built at the
  // first call per kept set, then shared: the plain one (no kept special token) for the engine's
  // life, the last kMaxKeptVocabularies others (least recently used dropped; a dropped set is
  // built again when asked). Thread-safe; the build (about 12 ms for 49,152 tokens) runs on the
  // caller's thread. FailedPrecondition without a tokenizer.
  absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> Vocabulary(
      absl::Span<const TokenId> kept_special = {}) const;
  static constexpr size_t kMaxKeptVocabularies = 4;
  int32_t block_tokens() const { return block_tokens_; }

 private:
  struct PendingReservation {
    std::vector<Hash128> hashes;
    int64_t positions = 0;
    bool import = false;    // ReserveImport's
    int64_t max_fresh = 0;  // import
    std::function<void(absl::StatusOr<KvReservation>)> done;
  };

  struct PendingHold {
    std::string id;
    int64_t blocks = 0;
    std::function<void(absl::StatusOr<std::vector<BlockId>>)> done;
  };
  struct PendingCache {
    std::vector<Hash128> hashes;
    std::vector<BlockId> blocks;
  };

  Engine(ForwardModel* model, KvBlockPool* pool, const Tokenizer* tokenizer,
         const EngineOptions& options, KvBlockPool* window_pool);
  void RunHold(PendingHold& hold);
  void DrainInbox();
  // A submitted request's sequences (its imports offered to the prefix cache and held).
  void AddRequest(EngineRequest r, absl::Duration submitted_at);
  void RunReservation(PendingReservation& r);
  // Offers the full blocks `seq` computed to the caches (and its request's on_computed_blocks).
  void CacheFullBlocks(Sequence& seq);
  void OfferComputedBlocks(Sequence& seq, int64_t first, int64_t end);
  // `greedy`: the token the model chose for a sequence GreedyOnly asked it for (no logits then),
  // else kNoToken.
  void Deliver(Sequence& seq, absl::Span<const float> logits, TokenId greedy = kNoToken);
  // Whether `seq`'s next token is its logits' greedy choice and nothing else is read from them
  // (temperature 0, no bias, penalties, logprobs, grammar, suppressed stop ids, kept logits,
  // fork or prefill-only hand-off): the model may then choose it (Backend::ArgMaxRows).
  bool GreedyOnly(const Sequence& seq) const;
  // Samples `seq`'s next token from `logits` (or takes `greedy`) into an event; `reason` is why
  // it ends the choice (kNone: it goes on).
  TokenEvent NextToken(Sequence& seq, absl::Span<const float> logits, FinishReason* reason,
                       TokenId greedy = kNoToken);
  // stream_kv: a progress event when a step completed more of the prompt's blocks.
  void ReportKvProgress(Sequence& seq);
  // A prefill-only request's prompt is computed: each choice's first token, and the handoff.
  void DeliverPrefillOnly(Sequence& seq, absl::Span<const float> logits);
  // Park(id) on the engine thread: true when it is settled (parked, or not live), false when it
  // cannot be parked yet.
  bool ParkRequest(const std::string& id);
  // Releases the handoff of `id`, if any (its id becomes reusable); true when there was one.
  bool DropHandoff(const std::string& id);
  void ExpireHandoffs();
  void Fork(Sequence& first, absl::Span<const float> logits);
  void Finish(Sequence& seq, FinishReason reason, TokenEvent event);
  void Emit(const Sequence& seq, TokenEvent& event);
  // Drops finished sequences and publishes the caches' events and the stats.
  void RemoveFinished();
  bool InboxHasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !submitted_.empty() || !aborted_.empty() || !released_.empty() || !parked_.empty() ||
           !reservations_.empty() || !holds_.empty() || !caches_.empty() || clear_cache_;
  }
  void Loop();
  // Waits on wake_ for news in the inbox, freed blocks, a stop, (`or_work_left`) sequences still
  // to run, or the next handoff's expiry.
  void WaitForNews(bool or_work_left) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ForwardModel* const model_;
  const Tokenizer* const tokenizer_;
  const EngineOptions options_;
  Clock* const clock_;
  const int32_t block_tokens_;
  // The KV pools and their caches (both pools of a hybrid model).
  HybridKvCache kv_;
  KvEventJournal journal_;
  std::vector<TokenId> eos_ids_;  // the model's and the tokenizer's, sorted
  mutable absl::Mutex vocabulary_mu_;
  mutable std::shared_ptr<const grammar::TokenTrie> vocabulary_ ABSL_GUARDED_BY(vocabulary_mu_);
  // Vocabularies with kept special tokens, by the sorted special ids, most recently used last.
  mutable std::vector<std::pair<std::vector<TokenId>, std::shared_ptr<const grammar::TokenTrie>>>
      kept_vocabularies_ ABSL_GUARDED_BY(vocabulary_mu_);
  // The request's constraint checked: its vocabulary the engine's, and each resume point's
  // tokens accepted by a fresh matcher.
  absl::Status ValidateConstraint(const EngineRequest& r) const;
  // A matcher for `seq` (of a request with a constraint), its resumed tokens replayed.
  absl::Status StartMatcher(Sequence& seq, absl::Span<const TokenId> generated) const;

  // Engine-thread state.
  EngineStats stats_;
  Scheduler scheduler_;
  HandoffBook handoffs_;
  absl::flat_hash_set<std::string> parking_;  // Park()ed, not parkable yet
  std::vector<std::string> released_ids_;     // handoffs released since RemoveFinished
  std::vector<float> logits_;

  // Inbox, filled by other threads.
  mutable absl::Mutex mu_;
  absl::CondVar wake_;
  struct Submitted {
    EngineRequest r;
    absl::Duration at;  // clock_->Monotonic() at Submit: the start of its queue time
  };
  std::deque<Submitted> submitted_ ABSL_GUARDED_BY(mu_);
  int64_t submitted_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // prompt tokens in submitted_
  std::vector<std::string> aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> released_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> parked_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingReservation> reservations_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingHold> holds_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingCache> caches_ ABSL_GUARDED_BY(mu_);
  bool clear_cache_ ABSL_GUARDED_BY(mu_) = false;
  // A release elsewhere freed blocks since the engine last looked.
  bool blocks_freed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::string> live_ids_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Started under mu_ (Start); joined by Stop, the one caller that ends it.
  std::thread thread_;
  EngineStats published_ ABSL_GUARDED_BY(mu_);  // stats_ as of the last step
  // Never admitted yet, as of the last step.
  int64_t published_waiting_requests_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_ENGINE_H_
