#include "services/encoder/embedding_cache.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {

EmbeddingCache::EmbeddingCache(const EmbeddingCacheOptions& options)
    : options_(options), clock_(options.clock != nullptr ? *options.clock : RealClock()) {}

void EmbeddingCache::ExpireLocked(absl::Time now) {
  while (!expiry_.empty() && expiry_.begin()->first <= now) {
    auto it = handles_.find(expiry_.begin()->second);
    if (it != handles_.end()) {
      UnpinLocked(it->second.entry);
      handles_.erase(it);
      ++expired_;
    }
    expiry_.erase(expiry_.begin());
  }
}

void EmbeddingCache::UnpinLocked(Lru::iterator entry) {
  if (--entry->pins == 0) pinned_bytes_ -= entry->bytes;
}

absl::StatusOr<EmbeddingHandle> EmbeddingCache::NewHandleLocked(Lru::iterator entry,
                                                                absl::Time now) {
  if (static_cast<int64_t>(handles_.size()) >= options_.max_handles) {
    return absl::ResourceExhaustedError(
        absl::StrCat(handles_.size(),
                     " live embedding handles, the most this encoder keeps; "
                     "release handles or retry later"));
  }
  std::string handle;
  do {
    handle = absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(random_),
                             absl::Uniform<uint64_t>(random_));
  } while (handles_.count(handle) != 0);
  if (entry->pins++ == 0) pinned_bytes_ += entry->bytes;
  const absl::Time expires = now + options_.ttl;
  handles_.emplace(handle, Live{entry, expires});
  expiry_.emplace(expires, handle);
  lru_.splice(lru_.begin(), lru_, entry);
  return EmbeddingHandle{handle, expires, entry->bytes};
}

absl::StatusOr<EmbeddingHandle> EmbeddingCache::Pin(const Hash128& key) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) {
    return absl::NotFoundError(absl::StrCat("no embeddings cached for image ", key.ToHex()));
  }
  return NewHandleLocked(it->second, now);
}

EmbeddingRows EmbeddingCache::Lookup(const Hash128& key) {
  absl::MutexLock lock(&mu_);
  auto it = by_key_.find(key);
  return it == by_key_.end() ? nullptr : it->second->rows;
}

absl::StatusOr<EmbeddingHandle> EmbeddingCache::Put(const Hash128& key, EmbeddingRows rows) {
  const absl::Time now = clock_.Now();
  const int64_t bytes = static_cast<int64_t>(rows->size() * sizeof(float));
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = by_key_.find(key);
  if (it != by_key_.end()) return NewHandleLocked(it->second, now);
  if (static_cast<int64_t>(handles_.size()) >= options_.max_handles) {
    return absl::ResourceExhaustedError(
        absl::StrCat(handles_.size(),
                     " live embedding handles, the most this encoder keeps; "
                     "release handles or retry later"));
  }
  if (bytes > options_.capacity_bytes - pinned_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the embedding cache cannot hold this image's ", bytes,
                     " bytes: ", pinned_bytes_, " of its ", options_.capacity_bytes,
                     " bytes are pinned by live handles; release handles or retry later"));
  }
  // Evict the least recently used unpinned entries until the rows fit (they do: the unpinned
  // bytes are at least what is missing).
  for (auto victim = lru_.end(); bytes_ + bytes > options_.capacity_bytes;) {
    --victim;
    if (victim->pins > 0) continue;
    bytes_ -= victim->bytes;
    by_key_.erase(victim->key);
    victim = lru_.erase(victim);
    ++evicted_;
  }
  lru_.push_front(Entry{key, std::move(rows), bytes, 0});
  by_key_.emplace(key, lru_.begin());
  bytes_ += bytes;
  return NewHandleLocked(lru_.begin(), now);
}

absl::StatusOr<EmbeddingRows> EmbeddingCache::Get(const std::string& handle) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = handles_.find(handle);
  if (it == handles_.end()) {
    return absl::NotFoundError("no such embeddings handle (unknown, released or expired)");
  }
  lru_.splice(lru_.begin(), lru_, it->second.entry);
  return it->second.entry->rows;
}

bool EmbeddingCache::Release(const std::string& handle) {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = handles_.find(handle);
  if (it == handles_.end()) return false;
  auto [first, last] = expiry_.equal_range(it->second.expires);
  for (auto e = first; e != last; ++e) {
    if (e->second == handle) {
      expiry_.erase(e);
      break;
    }
  }
  UnpinLocked(it->second.entry);
  handles_.erase(it);
  return true;
}

void EmbeddingCache::ExpireHandles() {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
}

EmbeddingCacheStats EmbeddingCache::Stats() {
  const absl::Time now = clock_.Now();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  EmbeddingCacheStats s;
  s.entries = static_cast<int64_t>(lru_.size());
  s.bytes = bytes_;
  s.pinned_bytes = pinned_bytes_;
  s.handles = static_cast<int64_t>(handles_.size());
  s.evicted = evicted_;
  s.expired_handles = expired_;
  return s;
}

}  // namespace ferry
