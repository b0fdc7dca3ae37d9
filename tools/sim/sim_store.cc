#include "tools/sim/sim_store.h"

#include <utility>

namespace ferry {

void SimStore::Put(const Hash128& hash, std::string bytes) {
  auto it = map_.find(hash);
  if (it != map_.end()) {  // content-addressed: the same bytes; only its recency changes
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return;
  }
  if (max_blocks_ <= 0) return;
  while (static_cast<int64_t>(map_.size()) >= max_blocks_) {
    map_.erase(lru_.back());
    lru_.pop_back();
    ++evicted_;
  }
  lru_.push_front(hash);
  map_.emplace(hash, Entry{std::move(bytes), lru_.begin()});
}

int64_t SimStore::Prefix(absl::Span<const Hash128> hashes) const {
  int64_t n = 0;
  for (const Hash128& h : hashes) {
    if (!map_.contains(h)) break;
    ++n;
  }
  return n;
}

const std::string* SimStore::Get(const Hash128& hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return &it->second.bytes;
}

}  // namespace ferry
