// The encoder's embedding cache: the rows of encoded images (EmbeddingRows), keyed by the image's
// content hash (XXH3-128 of its bytes; one cache serves one vision tower, whose digest the
// encoder reports with every handle), under a byte cap, and the handles callers fetch them by.
//
// Handles: Put and Pin answer a new handle on an entry, valid until its TTL passes (from the
// moment it was made) or Release. A live handle pins its entry: pinned entries are never evicted,
// so a handle answered by Encode can always be fetched until it expires. Unpinned entries stay
// cached (a later Encode of the same bytes is a hit) and are evicted least recently used first
// when a Put needs room. A Put that cannot make room because the pinned entries fill the cap is
// refused (ResourceExhausted): the caller's image was not cached, nothing else was evicted.
// Expired handles are dropped lazily, at the start of every call (and by ExpireHandles).
//
// Bounds: capacity_bytes over every entry's rows (pinned or not); at most max_handles live
// handles (Put and Pin answer ResourceExhausted beyond). A handle is an unguessable 128-bit
// random hex string, so one caller cannot fetch another's embeddings by counting.
//
// Time comes from a Clock (engine/common/clock.h: a FakeClock in tests). Thread-safe.

#ifndef FERRY_SERVICES_ENCODER_EMBEDDING_CACHE_H_
#define FERRY_SERVICES_ENCODER_EMBEDDING_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "engine/common/hash128.h"

namespace ferry {

using EmbeddingRows = std::shared_ptr<const std::vector<float>>;

struct EmbeddingCacheOptions {
  int64_t capacity_bytes = int64_t{1} << 30;
  absl::Duration ttl = absl::Minutes(5);
  int64_t max_handles = 1 << 16;
  const Clock* clock = nullptr;  // null: RealClock()
};

struct EmbeddingHandle {
  std::string handle;
  absl::Time expires;
  int64_t size_bytes = 0;
};

struct EmbeddingCacheStats {
  int64_t entries = 0;
  int64_t bytes = 0;
  int64_t pinned_bytes = 0;
  int64_t handles = 0;
  int64_t evicted = 0;          // entries evicted under the cap, since creation
  int64_t expired_handles = 0;  // handles dropped by their TTL, since creation
};

class EmbeddingCache {
 public:
  explicit EmbeddingCache(const EmbeddingCacheOptions& options);

  // A handle on the entry of `key` when it is cached (and the entry becomes the most recently
  // used); NotFound otherwise; ResourceExhausted at max_handles.
  absl::StatusOr<EmbeddingHandle> Pin(const Hash128& key);

  // The rows cached under `key`, or null (no handle made; the entry is not touched).
  EmbeddingRows Lookup(const Hash128& key);

  // Caches `rows` under `key` (kept as they are when the key is already cached: the same bytes
  // give the same rows) and answers a handle on it. ResourceExhausted when the rows are larger
  // than the cap, when the pinned entries leave no room for them, or at max_handles.
  absl::StatusOr<EmbeddingHandle> Put(const Hash128& key, EmbeddingRows rows);

  // The rows of a live handle (the entry stays pinned by it); NotFound when the handle is
  // unknown, released or expired. The rows stay valid for the caller even if the handle goes.
  absl::StatusOr<EmbeddingRows> Get(const std::string& handle);

  // Drops a handle now; false when it was unknown (or already expired or released).
  bool Release(const std::string& handle);

  // Drops every handle whose TTL has passed.
  void ExpireHandles();

  EmbeddingCacheStats Stats();
  int64_t capacity_bytes() const { return options_.capacity_bytes; }
  absl::Duration ttl() const { return options_.ttl; }

 private:
  struct Entry {
    Hash128 key;
    EmbeddingRows rows;
    int64_t bytes = 0;
    int64_t pins = 0;
  };
  using Lru = std::list<Entry>;  // front: most recently used
  struct Live {
    Lru::iterator entry;
    absl::Time expires;
  };

  void ExpireLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<EmbeddingHandle> NewHandleLocked(Lru::iterator entry, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnpinLocked(Lru::iterator entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const EmbeddingCacheOptions options_;
  const Clock& clock_;
  absl::Mutex mu_;
  absl::BitGen random_ ABSL_GUARDED_BY(mu_);
  Lru lru_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Hash128, Lru::iterator> by_key_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Live> handles_ ABSL_GUARDED_BY(mu_);
  std::multimap<absl::Time, std::string> expiry_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pinned_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evicted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_ENCODER_EMBEDDING_CACHE_H_
