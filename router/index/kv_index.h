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
// Exact up to 64-bit collisions: every event is applied (a STORED of a block held, or an
// EVICTED of one not held, changes nothing, so a replayed or resynchronised stream converges to
// the worker's set), and a table keys blocks by 64 bits of their hash (block_table.h): a lookup
// of a block no worker holds finds one with probability n / 2^64 for n blocks in its table
// (1e-14 at 100k), and then over-predicts one worker's prefix by a block.
//
// Bounded: the tables (block_table.h: 16 bytes a slot, at most 3/4 full, so 21..43 bytes a key
// and fewer per (worker, block) entry when workers share blocks) never take more than max_bytes
// in all, which is what bytes() reports. A STORED event whose key would make its table grow past
// the cap is dropped and counted (dropped()): the index then under-predicts that worker's hits,
// never over-predicts them; evictions and clears free room again (a table a quarter full
// shrinks). While one table grows, its old array lives on until the new one is filled: the
// process holds up to that table's bytes more for a moment (a shard's, 1/16 of the index).
// Sized for the workers' caches it never drops: 64 workers x 16k blocks take about 35 MB.
//
// Threads: one reader/writer lock. A decision (Match) holds it shared while it walks the chain
// (about a microsecond); an event call holds it exclusively for a chunk of 128 hashes at a time.
// Decisions never wait for more than one chunk, never for a whole snapshot. The tables are split
// into 16 shards by hash so that a growing table (a rehash) holds up decisions for 1/16 of the
// index at most. Thread-safe.

#ifndef FERRY_ROUTER_INDEX_KV_INDEX_H_
#define FERRY_ROUTER_INDEX_KV_INDEX_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "router/index/block_table.h"

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
  // Block hashes are XXH3 output already: the shard is hi's top 4 bits, the slot lo's low bits.
  using Table = BlockTable;
  // One table per group of 64 slots, per cache (main, window): tables[2 * group + window].
  struct Shard {
    std::vector<Table> tables;
  };

  static int ShardOf(const Hash128& h) { return static_cast<int>(h.hi >> 60); }
  // Applies one kind of event for `slot`.
  void Apply(int slot, absl::Span<const Hash128> hashes, bool window, bool stored);
  // Makes room for one more key in `table`, within the cap; false: it would exceed it.
  bool MakeRoom(Table& table);
  // Shrinks a table a quarter full (or less) to the smallest capacity that holds its keys.
  void MaybeShrink(Table& table);

  const KvIndexOptions options_;
  // Readers (Match) share it; each writer holds it for one shard-sized chunk at a time.
  mutable absl::Mutex mu_;
  std::array<Shard, kShards> shards_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> bytes_{0};
  std::atomic<int64_t> entries_{0};
  std::atomic<int64_t> dropped_{0};
  std::atomic<int64_t> events_{0};

  absl::Mutex slots_mu_;  // serialises AddWorker / RemoveWorker
  // The slots made so far (a high-water mark), and per group of 64 the slots in use: Match reads
  // them without a lock.
  std::atomic<int> slot_count_{0};
  std::array<std::atomic<uint64_t>, 64> group_masks_{};
  // Held blocks per slot (main cache); sized for every slot ever made.
  std::unique_ptr<std::atomic<int64_t>[]> blocks_;
  static constexpr int kMaxSlots = 4096;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_INDEX_KV_INDEX_H_
