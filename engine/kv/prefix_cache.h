// The engine's prefix cache (ARCHITECTURE.md §4 "KV cache"): an index from chained block hash
// (engine/common/block_hash.h) to a KV block of the pool holding exactly that prefix's block.
//
// The cache holds one pool reference per cached block, so a cached block survives the request
// that computed it. A block that only the cache references is "unreferenced": those are kept in
// least-recently-used order and evicted (their reference dropped, the block freed) when the
// cache exceeds its byte cap or when the engine needs free blocks. Lookups find the longest
// cached prefix of a chain and hand the caller its own reference to each block.
//
// Events (stored / evicted block hashes) accumulate until taken, for the router's view of which
// worker holds which prefix; at most kMaxEvents are kept (the oldest are dropped and counted, and a
// consumer that sees drops resynchronises). A cache nobody reports on records none.
//
// A cache may also expire entries by age (SetTtl): an entry not stored, looked up or touched for
// the TTL is evicted by the next Expire() once nothing references it (the window layers' cache of
// a hybrid model keeps its blocks for a TTL; engine.h).
//
// Thread-compatible: the engine thread owns it.

#ifndef FERRY_ENGINE_KV_PREFIX_CACHE_H_
#define FERRY_ENGINE_KV_PREFIX_CACHE_H_

#include <cstdint>
#include <deque>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"
#include "engine/kv/kv_block_pool.h"

namespace ferry {

struct KvCacheEvent {
  enum class Kind { kStored, kEvicted };
  Kind kind;
  Hash128 hash;
};

class PrefixCache {
 public:
  static constexpr size_t kMaxEvents = size_t{1} << 16;

  // `pool` must outlive the cache. max_bytes bounds the bytes of the blocks the cache holds.
  PrefixCache(KvBlockPool* pool, int64_t max_bytes, bool record_events = true);
  ~PrefixCache();  // drops every reference it holds
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The blocks of the longest cached prefix of `hashes` (block i of the chain at index i), each
  // with one new reference for the caller. Marks them recently used.
  std::vector<BlockId> Lookup(absl::Span<const Hash128> hashes);
  // Whether `hash` is cached (no reference, no change to the recency order).
  bool Contains(const Hash128& hash) const { return entries_.contains(hash); }
  // The blocks of all of `hashes`, each with one new reference for the caller, or none at all
  // when one is missing. Marks them recently used.
  std::vector<BlockId> LookupAll(absl::Span<const Hash128> hashes);

  // Offers block i of a chain: stores hashes[i] -> blocks[i] for those not cached yet (taking a
  // reference) and marks all recently used. Then evicts down to the byte cap.
  void Insert(absl::Span<const Hash128> hashes, absl::Span<const BlockId> blocks);

  // Evicts up to `n` unreferenced blocks, least recently used first; returns how many.
  int64_t Evict(int64_t n);
  // Evicts unreferenced blocks while over the byte cap (blocks in use may keep it over until
  // their requests release them: call again then).
  void TrimToCap();
  // Entries unused for `ttl` (on clock->Monotonic()) expire; a zero or infinite ttl: never.
  // `clock` must outlive the cache.
  void SetTtl(absl::Duration ttl, Clock* clock);
  // Evicts the unreferenced entries that expired; returns how many (counted in expired()).
  int64_t Expire();
  int64_t expired() const { return expired_; }

  int64_t blocks() const { return static_cast<int64_t>(entries_.size()); }
  // Every hash cached now (no order).
  std::vector<Hash128> Hashes() const;
  int64_t bytes() const { return blocks() * block_bytes_; }
  int64_t max_bytes() const { return max_bytes_; }
  // Lookups and the blocks they found, for metrics.
  int64_t lookups() const { return lookups_; }
  int64_t hit_blocks() const { return hit_blocks_; }

  std::vector<KvCacheEvent> TakeEvents();
  // Events dropped because nobody took them in time (kMaxEvents), since creation.
  int64_t dropped_events() const { return dropped_events_; }

 private:
  struct Entry {
    BlockId block;
    std::list<Hash128>::iterator lru;  // position in lru_ (front = most recent)
    absl::Duration used;               // clock_->Monotonic() at the last use (with a TTL)
  };
  struct HashOf {
    size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
  };
  void Touch(Entry& e, const Hash128& hash);
  void Record(KvCacheEvent::Kind kind, const Hash128& hash);

  KvBlockPool* const pool_;
  const int64_t max_bytes_;
  const int64_t block_bytes_;
  const bool record_events_;
  absl::flat_hash_map<Hash128, Entry, HashOf> entries_;
  std::list<Hash128> lru_;
  std::deque<KvCacheEvent> events_;
  int64_t dropped_events_ = 0;
  int64_t lookups_ = 0;
  int64_t hit_blocks_ = 0;
  absl::Duration ttl_ = absl::ZeroDuration();
  Clock* clock_ = nullptr;
  int64_t expired_ = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_KV_PREFIX_CACHE_H_
