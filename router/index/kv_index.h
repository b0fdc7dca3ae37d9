// The router's index of which worker holds which KV block in its memory (ARCHITECTURE.md §6):
// per worker, the set of block hashes its prefix cache holds, as its Watch stream's KV events
// told (stored, evicted, cleared, snapshots; kv_event_feed.h applies them). The prefix-aware
// policy asks it, for a prompt's chain of block hashes, how many leading blocks each worker
// holds.
//
// Layout: workers have dense slots (AddWorker); slots are grouped by 64, and each group keeps,
// per block hash, one 64-bit word whose bit s says "slot s holds it". A prompt's chain is walked
// once per group: block i's word is ANDed into the set of workers still matching, so a decision
// costs at most one hash lookup per block per 64 workers, whatever the number of (worker, block)
// entries. A hybrid model's sliding-window cache (KvEvent.window_layers) is a second map of the
// same shape.
//
// Exact, not approximate: keys are the full 128-bit hashes, and every event is applied (a
// STORED of a block held, or an EVICTED of one not held, changes nothing, so a replayed or
// resynchronised stream converges to the worker's set).
//
// Bounded: the tables' bytes (bucket_count x (key, word) + one control byte, which is what
// bytes() reports) never exceed max_bytes. A STORED event that would need more (a new key that
// could make its table grow past the cap) is dropped and counted (dropped()): the index then
// under-predicts that worker's hits, never over-predicts them; evictions free room again. Sized
// for the workers' caches, it never drops: 64 workers x 16k blocks take about 40 MB.
//
// Threads: the tables are split into 16 shards by hash, each behind a reader/writer lock held
// for one lookup (Match) or one batch's share of a shard (the event calls). Decisions never
// wait for more than one shard's batch, never for a whole snapshot. Thread-safe.

#ifndef FERRY_ROUTER_INDEX_KV_INDEX_H_
#define FERRY_ROUTER_INDEX_KV_INDEX_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"

namespace ferry {

struct KvIndexOptions {
  uint64_t max_bytes = uint64_t{256} << 20;
};

class KvIndex {
 public:
  static constexpr int kShards = 16;

  explicit KvIndex(KvIndexOptions options = {});
  KvIndex(const KvIndex&) = delete;
  KvIndex& operator=(const KvIndex&) = delete;

  // A new worker's slot (0, 1, ...; a removed worker's slot is reused). Its set starts empty.
  int AddWorker();
  // Clears the worker's blocks and frees its slot.
  void RemoveWorker(int slot);
  int slots() const;

  // Events of one worker, one kind, one cache (`window`: the sliding-window layers' cache).
  void Stored(int slot, absl::Span<const Hash128> hashes, bool window = false);
  void Evicted(int slot, absl::Span<const Hash128> hashes, bool window = false);
  // Every block of the worker, in both caches.
  void Cleared(int slot);

  // For each slot s < prefix->size(): how many leading hashes of `chain` the worker holds
  // (0 for a free slot). Resizes `prefix` to slots() when it is smaller.
  void Match(absl::Span<const Hash128> chain, std::vector<int32_t>* prefix) const;
  // Whether `slot` holds `hash` (in the window cache when `window`).
  bool Holds(int slot, const Hash128& hash, bool window = false) const;

  // (worker, block) entries: held blocks summed over the workers, both caches.
  int64_t entries() const;
  // One worker's held blocks (the main cache).
  int64_t blocks(int slot) const;
  // The tables' bytes (see above), never above max_bytes.
  uint64_t bytes() const;
  uint64_t max_bytes() const { return options_.max_bytes; }
  // STORED hashes dropped at the cap, and events applied (hashes stored / evicted), ever.
  int64_t dropped() const;
  int64_t events() const;

 private:
  // Identity hash: block hashes are XXH3 output already. The shard takes hi's top bits, the
  // table lo.
  struct LoHash {
    size_t operator()(const Hash128& h) const { return static_cast<size_t>(h.lo); }
  };
  using Table = absl::flat_hash_map<Hash128, uint64_t, LoHash>;
  struct Shard {
    mutable absl::Mutex mu;
    // One table per group of 64 slots, per cache (main, window): tables[2 * group + window].
    std::vector<Table> tables ABSL_GUARDED_BY(mu);
  };

  static int ShardOf(const Hash128& h) { return static_cast<int>(h.hi >> 60); }
  static uint64_t TableBytes(size_t buckets);
  // Applies one kind of event for `slot` to the hashes of `hashes` that fall in shard `s`.
  void Apply(int slot, absl::Span<const Hash128> hashes, bool window, bool stored);

  const KvIndexOptions options_;
  std::array<Shard, kShards> shards_;
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> entries_{0};
  std::atomic<int64_t> dropped_{0};
  std::atomic<int64_t> events_{0};

  mutable absl::Mutex slots_mu_;
  std::vector<bool> used_ ABSL_GUARDED_BY(slots_mu_);
  // Held blocks per slot (main cache); sized for every slot ever made.
  std::unique_ptr<std::atomic<int64_t>[]> blocks_;
  static constexpr int kMaxSlots = 4096;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_INDEX_KV_INDEX_H_
