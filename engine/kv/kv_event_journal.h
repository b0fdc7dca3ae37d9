// The record of what an engine's prefix caches hold, for readers on other threads (the worker's
// Watch stream, routers' view of which worker holds which prefix; ARCHITECTURE.md §6).
//
// The engine thread appends every stored / evicted block hash of its caches, in the order they
// happened; each event gets the next sequence number (1, 2, ...). The journal keeps the last
// `capacity` events and the set of hashes held now (the result of every event so far), so a
// reader can take a consistent snapshot (the set as of sequence S) and then follow with the
// events after S; a reader that fell more than `capacity` events behind learns so from
// EventsAfter and takes a fresh snapshot. Memory is bounded by `capacity` events plus one entry
// per block the caches hold.
//
// A hybrid model on two pools has a second cache for its sliding-window layers (engine.h): its
// events carry window = true and its hashes are a set of their own. A cached prefix of k blocks
// is usable there only as far as the window set also holds the blocks its next row sees.
//
// Thread-safe.

#ifndef FERRY_ENGINE_KV_KV_EVENT_JOURNAL_H_
#define FERRY_ENGINE_KV_KV_EVENT_JOURNAL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "engine/kv/prefix_cache.h"

namespace ferry {

struct JournalEvent {
  uint64_t sequence = 0;
  KvCacheEvent::Kind kind = KvCacheEvent::Kind::kStored;
  Hash128 hash;
  bool window = false;  // the window layers' cache
};

struct JournalSnapshot {
  uint64_t sequence = 0;               // the state after this event (0: before any)
  std::vector<Hash128> hashes;         // held by the prefix cache, sorted
  std::vector<Hash128> window_hashes;  // held by the window layers' cache, sorted
};

class KvEventJournal {
 public:
  static constexpr size_t kDefaultCapacity = size_t{1} << 16;

  explicit KvEventJournal(size_t capacity = kDefaultCapacity);
  KvEventJournal(const KvEventJournal&) = delete;
  KvEventJournal& operator=(const KvEventJournal&) = delete;

  // Records `events` of one cache, in order.
  void Append(absl::Span<const KvCacheEvent> events, bool window);
  // The cache lost events it could not record (its own bound): the held sets become exactly
  // `hashes` / `window_hashes`, and every reader needs a fresh snapshot (EventsAfter fails for
  // any earlier sequence).
  void Reset(absl::Span<const Hash128> hashes, absl::Span<const Hash128> window_hashes);

  JournalSnapshot Snapshot() const;
  // Appends to `out` the events with sequence > `after`, at most `max_events` of them, and
  // returns true; false (nothing appended) when some of them are no longer kept.
  bool EventsAfter(uint64_t after, size_t max_events, std::vector<JournalEvent>* out) const;

  uint64_t last_sequence() const;
  // Blocks held now (prefix cache, window cache).
  int64_t held() const;
  int64_t window_held() const;
  // How many leading hashes of `hashes` the prefix cache holds now: a hint (the engine may evict
  // them before it admits a request), answered without the engine thread.
  int64_t CachedPrefix(absl::Span<const Hash128> hashes) const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<JournalEvent> events_ ABSL_GUARDED_BY(mu_);
  uint64_t last_ ABSL_GUARDED_BY(mu_) = 0;
  // Readers may continue from any sequence >= floor_ (events after it are all kept).
  uint64_t floor_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<Hash128> held_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Hash128> window_held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_ENGINE_KV_KV_EVENT_JOURNAL_H_
