#include "router/index/kv_index.h"

#include <algorithm>

namespace ferry {

namespace {

// The group of 64 slots a slot is in, and its bit there.
int GroupOf(int slot) { return slot >> 6; }
uint64_t BitOf(int slot) { return uint64_t{1} << (slot & 63); }

}  // namespace

KvIndex::KvIndex(KvIndexOptions options)
    : options_(options), blocks_(new std::atomic<int64_t>[kMaxSlots]) {
  for (int i = 0; i < kMaxSlots; ++i) blocks_[i].store(0, std::memory_order_relaxed);
}

uint64_t KvIndex::TableBytes(size_t buckets) {
  return buckets == 0 ? 0 : buckets * (sizeof(Table::value_type) + 1);
}

int KvIndex::AddWorker() {
  absl::MutexLock lock(&slots_mu_);
  int slot = 0;
  while (slot < static_cast<int>(used_.size()) && used_[slot]) ++slot;
  if (slot >= kMaxSlots) return -1;
  if (slot == static_cast<int>(used_.size())) used_.push_back(false);
  used_[slot] = true;
  const size_t tables = 2 * static_cast<size_t>(GroupOf(slot) + 1);
  for (Shard& shard : shards_) {
    absl::MutexLock shard_lock(&shard.mu);
    if (shard.tables.size() < tables) shard.tables.resize(tables);
  }
  blocks_[slot].store(0);
  return slot;
}

void KvIndex::RemoveWorker(int slot) {
  if (slot < 0) return;
  Cleared(slot);
  absl::MutexLock lock(&slots_mu_);
  if (slot < static_cast<int>(used_.size())) used_[slot] = false;
}

int KvIndex::slots() const {
  absl::MutexLock lock(&slots_mu_);
  return static_cast<int>(used_.size());
}

void KvIndex::Stored(int slot, absl::Span<const Hash128> hashes, bool window) {
  Apply(slot, hashes, window, /*stored=*/true);
}

void KvIndex::Evicted(int slot, absl::Span<const Hash128> hashes, bool window) {
  Apply(slot, hashes, window, /*stored=*/false);
}

void KvIndex::Apply(int slot, absl::Span<const Hash128> hashes, bool window, bool stored) {
  if (slot < 0 || slot >= kMaxSlots || hashes.empty()) return;
  const size_t t = 2 * static_cast<size_t>(GroupOf(slot)) + (window ? 1 : 0);
  const uint64_t bit = BitOf(slot);
  // The hashes by shard (a counting sort of their positions), so that each shard is locked once.
  thread_local std::vector<uint32_t> order;
  std::array<uint32_t, kShards + 1> start{};
  for (const Hash128& h : hashes) ++start[ShardOf(h) + 1];
  for (int s = 0; s < kShards; ++s) start[s + 1] += start[s];
  order.resize(hashes.size());
  {
    std::array<uint32_t, kShards> next;
    std::copy(start.begin(), start.begin() + kShards, next.begin());
    for (uint32_t i = 0; i < hashes.size(); ++i) order[next[ShardOf(hashes[i])]++] = i;
  }
  int64_t changed = 0, dropped = 0;
  for (int s = 0; s < kShards; ++s) {
    if (start[s] == start[s + 1]) continue;
    Shard& shard = shards_[s];
    absl::MutexLock lock(&shard.mu);
    if (t >= shard.tables.size()) return;  // not a slot AddWorker made
    Table& table = shard.tables[t];
    for (uint32_t k = start[s]; k < start[s + 1]; ++k) {
      const Hash128& h = hashes[order[k]];
      if (!stored) {
        auto it = table.find(h);
        if (it == table.end() || (it->second & bit) == 0) continue;
        it->second &= ~bit;
        if (it->second == 0) table.erase(it);
        ++changed;
        continue;
      }
      auto it = table.find(h);
      if (it != table.end()) {
        if ((it->second & bit) == 0) {
          it->second |= bit;
          ++changed;
        }
        continue;
      }
      // A new key may make the table grow once: reserve that much of the cap first. (Abseil
      // grows a table that is out of room to 2 x capacity + 1, unless it is over 16 slots and at
      // most 25/32 full of live keys: then it only drops its tombstones, in place.)
      const size_t before = table.bucket_count();
      const bool may_grow = before <= 16 || table.size() * 32 > before * 25;
      const uint64_t headroom = may_grow ? TableBytes(2 * before + 1) - TableBytes(before) : 0;
      if (bytes_.fetch_add(headroom) + headroom > options_.max_bytes) {
        bytes_.fetch_sub(headroom);
        ++dropped;
        continue;
      }
      table.emplace(h, bit);
      const uint64_t grown = TableBytes(table.bucket_count()) - TableBytes(before);
      bytes_.fetch_add(grown);  // (== headroom or 0 when it grew as reserved)
      bytes_.fetch_sub(headroom);
      ++changed;
    }
  }
  const int64_t sign = stored ? 1 : -1;
  if (!window) blocks_[slot].fetch_add(sign * changed);
  entries_.fetch_add(sign * changed);
  events_.fetch_add(static_cast<int64_t>(hashes.size()));
  if (dropped > 0) dropped_.fetch_add(dropped);
}

void KvIndex::Cleared(int slot) {
  if (slot < 0 || slot >= kMaxSlots) return;
  const size_t group = static_cast<size_t>(GroupOf(slot));
  const uint64_t bit = BitOf(slot);
  int64_t removed = 0;
  for (Shard& shard : shards_) {
    absl::MutexLock lock(&shard.mu);
    for (size_t t = 2 * group; t < 2 * group + 2 && t < shard.tables.size(); ++t) {
      Table& table = shard.tables[t];
      for (auto it = table.begin(); it != table.end();) {
        if ((it->second & bit) == 0) {
          ++it;
          continue;
        }
        ++removed;
        it->second &= ~bit;
        if (it->second == 0) {
          table.erase(it++);
        } else {
          ++it;
        }
      }
      // Give back what the worker's blocks took (rehash(0) shrinks the table to its keys).
      const size_t before = table.bucket_count();
      table.rehash(0);
      bytes_.fetch_sub(TableBytes(before) - TableBytes(table.bucket_count()));
    }
  }
  blocks_[slot].store(0);
  entries_.fetch_sub(removed);
}

void KvIndex::Match(absl::Span<const Hash128> chain, std::vector<int32_t>* prefix) const {
  uint64_t masks[kMaxSlots / 64];
  int n_slots;
  {
    absl::MutexLock lock(&slots_mu_);
    n_slots = static_cast<int>(used_.size());
    std::fill(masks, masks + (n_slots + 63) / 64, 0);
    for (int s = 0; s < n_slots; ++s) {
      if (used_[s]) masks[GroupOf(s)] |= BitOf(s);
    }
  }
  if (static_cast<int>(prefix->size()) < n_slots) prefix->resize(n_slots);
  std::fill(prefix->begin(), prefix->end(), 0);
  const int32_t n = static_cast<int32_t>(chain.size());
  const int groups = (n_slots + 63) / 64;
  for (int g = 0; g < groups; ++g) {
    uint64_t alive = masks[g];
    const size_t t = 2 * static_cast<size_t>(g);
    int32_t i = 0;
    for (; i < n && alive != 0; ++i) {
      const Hash128& h = chain[i];
      const Shard& shard = shards_[ShardOf(h)];
      uint64_t bits = 0;
      {
        absl::ReaderMutexLock lock(&shard.mu);
        if (t < shard.tables.size()) {
          auto it = shard.tables[t].find(h);
          if (it != shard.tables[t].end()) bits = it->second;
        }
      }
      for (uint64_t dead = alive & ~bits; dead != 0; dead &= dead - 1) {
        const int s = g * 64 + __builtin_ctzll(dead);
        if (s < static_cast<int>(prefix->size())) (*prefix)[s] = i;
      }
      alive &= bits;
    }
    for (; alive != 0; alive &= alive - 1) {
      const int s = g * 64 + __builtin_ctzll(alive);
      if (s < static_cast<int>(prefix->size())) (*prefix)[s] = i;
    }
  }
}

bool KvIndex::Holds(int slot, const Hash128& hash, bool window) const {
  if (slot < 0 || slot >= kMaxSlots) return false;
  const size_t t = 2 * static_cast<size_t>(GroupOf(slot)) + (window ? 1 : 0);
  const Shard& shard = shards_[ShardOf(hash)];
  absl::ReaderMutexLock lock(&shard.mu);
  if (t >= shard.tables.size()) return false;
  auto it = shard.tables[t].find(hash);
  return it != shard.tables[t].end() && (it->second & BitOf(slot)) != 0;
}

int64_t KvIndex::entries() const { return entries_.load(); }
int64_t KvIndex::blocks(int slot) const {
  return slot < 0 || slot >= kMaxSlots ? 0 : blocks_[slot].load();
}
uint64_t KvIndex::bytes() const { return bytes_.load(); }
int64_t KvIndex::dropped() const { return dropped_.load(); }
int64_t KvIndex::events() const { return events_.load(); }

}  // namespace ferry
