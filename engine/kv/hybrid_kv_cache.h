// The engine's KV memory as one component (ARCHITECTURE.md §4 "KV cache", "SWA bounded replay"),
// as llama.cpp's iSWA cache holds its two: the full-attention layers' pool and prefix cache, and,
// for a hybrid model (sliding-window and full-attention layers), the window layers' pool and
// window cache. The engine and its scheduler ask it for blocks, cached prefixes, reservations and
// copies; they never branch on which pool: with one pool (every layer in it) the window half is
// simply absent.
//
// A sequence's KV is a KvTables: the full pool's table and the window pool's, indexed alike (the
// window table's entries before the window are kNoBlock). The window layers keep only what their
// window still covers: Slide gives back the window blocks no later row can see (to the window
// cache, or free), so a sequence holds about (window + chunk) / block_tokens + 1 of them whatever
// its length. Full blocks of the window layers are cached under the same block hashes as the
// prefix cache; a cached prefix of k blocks is of use only when the window cache also holds the
// window blocks the next row sees, or, when cheaper, with a replay of its last positions that
// rebuilds them (WindowReplay: exact, the default, or bounded and then approximate).
//
// Ownership: the pools are the caller's and outlive the cache; the caches hold one reference per
// cached block; a KvTables' blocks carry one reference each, which Release gives back.
// Thread-compatible: owned by the engine thread (the pools themselves are thread-safe).

#ifndef FERRY_ENGINE_KV_HYBRID_KV_CACHE_H_
#define FERRY_ENGINE_KV_HYBRID_KV_CACHE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/kv_event_journal.h"
#include "engine/kv/prefix_cache.h"

namespace ferry {

// One sequence's KV: its tables in both pools, and the window table's bookkeeping.
struct KvTables {
  std::vector<BlockId> blocks;
  // The window pool's table, indexed like `blocks`; kNoBlock before window_begin (given back or
  // never held). Empty with one pool.
  std::vector<BlockId> window_blocks;
  int64_t window_begin = 0;
  int64_t window_cached = 0;  // of window_blocks, offered to the window cache
};

// Blocks reserved for KV that arrives from elsewhere (Engine::Reserve, ReserveImport).
struct KvReservation {
  std::vector<BlockId> blocks;         // the table: cached prefix blocks, then fresh ones
  std::vector<BlockId> window_blocks;  // with a window pool: indexed like blocks; blocks from
                                       // the one the row at `positions` sees (and the cached
                                       // prefix's), kNoBlock elsewhere
  int64_t cached_blocks = 0;           // leading blocks that came from the prefix cache
};

// How a cached prefix's window layers are rebuilt (SWA replay), and what the window cache held.
struct WindowReplay {
  int64_t from = 0;  // the first position replayed (the window floor)
  int64_t end = 0;   // the cached prefix's positions; 0: no replay
  bool approximate = false;
  int64_t longest = 0;   // blocks of the longest prefix the full-attention cache held
  int64_t windowed = 0;  // of those, the longest prefix the window cache also served
};

struct HybridKvCacheOptions {
  int64_t prefix_cache_bytes = int64_t{1} << 30;
  int64_t window_cache_bytes = int64_t{256} << 20;
  // The window cache's blocks expire this long after their last use (zero: never), on `clock`.
  absl::Duration window_cache_ttl = absl::Seconds(180);
  Clock* clock = nullptr;
  // The model's widest sliding window, in positions (0: none), and the positions a replay runs
  // for the window layers' KV to be exact (ForwardModel::exact_replay_tokens).
  int64_t max_window = 0;
  int64_t exact_replay_tokens = 0;
  // Bounded replay: at most this many positions (when fewer than exact), approximate.
  bool bounded_replay = false;
  int64_t bounded_replay_tokens = 128;
};

class HybridKvCache {
 public:
  // `window_pool` null: every layer in `pool`. Both outlive the cache.
  HybridKvCache(KvBlockPool* pool, KvBlockPool* window_pool, const HybridKvCacheOptions& options);
  HybridKvCache(const HybridKvCache&) = delete;
  HybridKvCache& operator=(const HybridKvCache&) = delete;

  bool hybrid() const { return window_pool_ != nullptr; }
  KvBlockPool& pool() const { return *pool_; }
  KvBlockPool* window_pool() const { return window_pool_; }
  int32_t block_tokens() const { return block_tokens_; }
  // Blocks of the pool, and whether `positions` positions fit in it at all.
  int64_t num_blocks() const { return pool_->num_blocks(); }
  bool CanEverHold(int64_t positions) const;
  // Blocks a service gave back wake the engine (KvBlockPool::SetFreeListener on both pools).
  void SetFreeListener(std::function<void()> listener);

  // The first block of the window table that the row at `position` can see.
  int64_t FirstWindowBlock(int64_t position) const;

  // ---- A sequence's tables ------------------------------------------------------------------
  // Fresh blocks short of `need` more in either pool.
  int64_t Shortfall(int64_t need) const;
  // Evicts unreferenced cached blocks toward `need` free in each pool; how many it evicted.
  int64_t EvictFor(int64_t need);
  // Appends `need` fresh blocks to both tables (Shortfall(need) must be 0).
  void Grow(KvTables* tables, int64_t need);
  // Gives back both tables' blocks (and with `trim`, brings the caches back under their caps).
  void Release(KvTables* tables, bool trim = true);
  // Keeps the blocks covering the first `positions` positions, gives back the rest.
  void Truncate(KvTables* tables, int64_t positions);
  // Gives back the window blocks no row from `computed` on can see.
  void Slide(KvTables* tables, int64_t computed);
  // The window bookkeeping of a sequence admitted with `tables` (its cached prefix) computed up
  // to `computed`.
  void Admitted(KvTables* tables, int64_t computed);
  // `into` gets the KV of the first `positions` positions of `from`: full blocks shared, the
  // partial last block copied (and the window bookkeeping as far as those positions). False
  // (nothing taken) when no block is free for the copy.
  bool Share(const KvTables& from, int64_t positions, KvTables* into);

  // ---- The caches -----------------------------------------------------------------------------
  // The longest usable cached prefix of `hashes` (at most `full` blocks), with a reference to
  // each block, into `tables` (the window table: kNoBlock before the window of the row after
  // them). With `replay` (a sequence's admission), a longer prefix whose window blocks are gone
  // may come with a replay of them instead (fresh window blocks from replay->from on); otherwise
  // *replay says what the caches held.
  void TakeCachedPrefix(absl::Span<const Hash128> hashes, int64_t full, KvTables* tables,
                        WindowReplay* replay = nullptr);
  // Offers full blocks [from, to) of `tables` (hashes[i] each) to the prefix cache, and the window
  // blocks from tables->window_cached to `to` to the window cache.
  void Cache(absl::Span<const Hash128> hashes, KvTables* tables, int64_t from, int64_t to);
  // Imported blocks (a KV store's) offered to the prefix cache under `hashes`.
  void CacheImported(absl::Span<const Hash128> hashes, absl::Span<const BlockId> blocks);
  // Gives back full-pool blocks (an import's hold) and brings the prefix cache under its cap.
  void ReleaseFull(std::vector<BlockId>* blocks);
  void EvictAll();
  // Window blocks past their TTL, evicted; how many.
  int64_t ExpireWindowBlocks();
  int64_t cached_blocks() const { return cache_.blocks(); }
  int64_t window_cached_blocks() const;
  // Moves the caches' events to `journal` (starting it over from what they hold when a cache
  // dropped events).
  void PublishEvents(KvEventJournal* journal);

  // ---- Reservations (KV that arrives from elsewhere) -------------------------------------------
  // The blocks for `positions` positions: the longest cached prefix of `hashes`, then fresh
  // blocks (window blocks from the one the row at `positions` sees); ResourceExhausted when the
  // pools cannot supply them (nothing held then).
  absl::StatusOr<KvReservation> Reserve(absl::Span<const Hash128> hashes, int64_t positions);
  // Blocks to import a prefix into, in the full-attention pool: the cached prefix of `hashes`,
  // then at most `max_fresh` fresh blocks for the rest; ResourceExhausted when not one was free.
  absl::StatusOr<KvReservation> ReserveImport(absl::Span<const Hash128> hashes, int64_t max_fresh);

 private:
  // Frees `n` blocks of `pool` by evicting unreferenced blocks of `cache`; false when it cannot.
  static bool MakeRoom(KvBlockPool* pool, PrefixCache* cache, int64_t n);

  KvBlockPool* const pool_;
  KvBlockPool* const window_pool_;  // null: every layer in pool_
  const HybridKvCacheOptions options_;
  const int32_t block_tokens_;
  PrefixCache cache_;
  std::unique_ptr<PrefixCache> window_cache_;
  int64_t dropped_events_ = 0;  // the caches' dropped_events() as of the last PublishEvents
};

}  // namespace ferry

#endif  // FERRY_ENGINE_KV_HYBRID_KV_CACHE_H_
