#include "engine/kv/prefix_cache.h"

#include "engine/common/log.h"

namespace ferry {

PrefixCache::PrefixCache(KvBlockPool* pool, int64_t max_bytes, bool record_events)
    : pool_(pool),
      max_bytes_(max_bytes),
      block_bytes_(static_cast<int64_t>(pool->layout().block_bytes())),
      record_events_(record_events) {}

PrefixCache::~PrefixCache() {
  std::vector<BlockId> held;
  for (const auto& [hash, entry] : entries_) held.push_back(entry.block);
  CHECK(pool_->Release(held).ok());
}

void PrefixCache::Touch(Entry& e, const Hash128& hash) {
  lru_.erase(e.lru);
  lru_.push_front(hash);
  e.lru = lru_.begin();
  if (clock_ != nullptr) e.used = clock_->Monotonic();
}

void PrefixCache::SetTtl(absl::Duration ttl, Clock* clock) {
  const bool on = ttl > absl::ZeroDuration() && ttl != absl::InfiniteDuration();
  ttl_ = on ? ttl : absl::ZeroDuration();
  clock_ = on ? clock : nullptr;
  if (clock_ == nullptr) return;
  const absl::Duration now = clock_->Monotonic();
  for (auto& [hash, entry] : entries_) entry.used = now;
}

int64_t PrefixCache::Expire() {
  if (clock_ == nullptr) return 0;
  const absl::Duration now = clock_->Monotonic();
  int64_t evicted = 0;
  // lru_ is in order of last use: the oldest at the back. Entries in use are skipped (they
  // expire once released, unless used again).
  for (auto it = lru_.end(); it != lru_.begin();) {
    --it;
    auto entry = entries_.find(*it);
    CHECK(entry != entries_.end());
    if (entry->second.used + ttl_ > now) break;
    const BlockId block = entry->second.block;
    if (pool_->ref_count(block) > 1) continue;
    CHECK(pool_->Release(absl::MakeConstSpan(&block, 1)).ok());
    Record(KvCacheEvent::Kind::kEvicted, *it);
    entries_.erase(entry);
    it = lru_.erase(it);
    ++evicted;
  }
  expired_ += evicted;
  return evicted;
}

void PrefixCache::Record(KvCacheEvent::Kind kind, const Hash128& hash) {
  if (!record_events_) return;
  if (events_.size() >= kMaxEvents) {
    events_.pop_front();
    ++dropped_events_;
  }
  events_.push_back({kind, hash});
}

std::vector<BlockId> PrefixCache::LookupAll(absl::Span<const Hash128> hashes) {
  ++lookups_;
  for (const Hash128& h : hashes) {
    if (!entries_.contains(h)) return {};
  }
  std::vector<BlockId> found;
  for (const Hash128& h : hashes) {
    Entry& e = entries_.find(h)->second;
    found.push_back(e.block);
    Touch(e, h);
  }
  CHECK(pool_->AddRef(found).ok());
  hit_blocks_ += static_cast<int64_t>(found.size());
  return found;
}

std::vector<BlockId> PrefixCache::Lookup(absl::Span<const Hash128> hashes) {
  ++lookups_;
  std::vector<BlockId> found;
  for (const Hash128& h : hashes) {
    auto it = entries_.find(h);
    if (it == entries_.end()) break;
    found.push_back(it->second.block);
    Touch(it->second, h);
  }
  CHECK(pool_->AddRef(found).ok());
  hit_blocks_ += static_cast<int64_t>(found.size());
  return found;
}

void PrefixCache::Insert(absl::Span<const Hash128> hashes, absl::Span<const BlockId> blocks) {
  CHECK_EQ(hashes.size(), blocks.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto it = entries_.find(hashes[i]);
    if (it != entries_.end()) {
      Touch(it->second, hashes[i]);
      continue;
    }
    CHECK(pool_->AddRef(absl::MakeConstSpan(&blocks[i], 1)).ok());
    lru_.push_front(hashes[i]);
    entries_.emplace(hashes[i], Entry{blocks[i], lru_.begin(),
                                      clock_ != nullptr ? clock_->Monotonic() : absl::Duration()});
    Record(KvCacheEvent::Kind::kStored, hashes[i]);
  }
  TrimToCap();
}

void PrefixCache::TrimToCap() {
  if (bytes() > max_bytes_) Evict((bytes() - max_bytes_ + block_bytes_ - 1) / block_bytes_);
}

int64_t PrefixCache::Evict(int64_t n) {
  int64_t evicted = 0;
  for (auto it = lru_.end(); evicted < n && it != lru_.begin();) {
    --it;
    auto entry = entries_.find(*it);
    CHECK(entry != entries_.end());
    const BlockId block = entry->second.block;
    if (pool_->ref_count(block) > 1) continue;  // a request still uses it
    CHECK(pool_->Release(absl::MakeConstSpan(&block, 1)).ok());
    Record(KvCacheEvent::Kind::kEvicted, *it);
    entries_.erase(entry);
    it = lru_.erase(it);
    ++evicted;
  }
  return evicted;
}

std::vector<Hash128> PrefixCache::Hashes() const {
  std::vector<Hash128> out;
  out.reserve(entries_.size());
  for (const auto& [hash, entry] : entries_) out.push_back(hash);
  return out;
}

std::vector<KvCacheEvent> PrefixCache::TakeEvents() {
  std::vector<KvCacheEvent> out(events_.begin(), events_.end());
  events_.clear();
  return out;
}

}  // namespace ferry
