#include "router/index/kv_index.h"

#include <algorithm>
#include <mutex>

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

bool KvIndex::MakeRoom(Table& table) {
  if (!table.Full()) return true;
  const size_t capacity = table.GrownCapacity();
  const uint64_t more = capacity * BlockTable::kSlotBytes - table.bytes();
  if (bytes_.fetch_add(more) + more > options_.max_bytes) {
    bytes_.fetch_sub(more);
    return false;
  }
  table.Rehash(capacity);
  return true;
}

void KvIndex::MaybeShrink(Table& table) {
  if (table.size() * 4 > table.capacity() || table.capacity() <= BlockTable::kMinCapacity) return;
  size_t capacity = 0;
  if (table.size() > 0) {
    capacity = BlockTable::kMinCapacity;
    while (table.size() * 4 > capacity * 3) capacity *= 2;
  }
  const uint64_t before = table.bytes();
  table.Rehash(capacity);
  bytes_.fetch_sub(before - table.bytes());
}

int KvIndex::AddWorker() {
  absl::MutexLock lock(&slots_mu_);
  const int made = slot_count_.load();
  int slot = 0;
  while (slot < made && (group_masks_[GroupOf(slot)].load() & BitOf(slot)) != 0) ++slot;
  if (slot >= kMaxSlots) return -1;
  const size_t tables = 2 * static_cast<size_t>(GroupOf(slot) + 1);
  {
    absl::MutexLock lock(&mu_);
    for (Shard& shard : shards_) {
      if (shard.tables.size() < tables) shard.tables.resize(tables);
    }
  }
  blocks_[slot].store(0);
  slot_count_.store(std::max(made, slot + 1));
  group_masks_[GroupOf(slot)].fetch_or(BitOf(slot));
  return slot;
}

void KvIndex::RemoveWorker(int slot) {
  if (slot < 0) return;
  Cleared(slot);
  absl::MutexLock lock(&slots_mu_);
  group_masks_[GroupOf(slot)].fetch_and(~BitOf(slot));
}

int KvIndex::slots() const { return slot_count_.load(); }

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
  int64_t changed = 0, dropped = 0;
  // In chunks, under the lock: a decision waits for one chunk at most.
  constexpr size_t kChunk = 128;
  for (size_t begin = 0; begin < hashes.size(); begin += kChunk) {
    const absl::Span<const Hash128> chunk = hashes.subspan(begin, kChunk);
    absl::MutexLock lock(&mu_);
    if (t < shards_[0].tables.size()) {  // (else not a slot AddWorker made)
      for (size_t k = 0; k < chunk.size(); ++k) {
        const Hash128& h = chunk[k];
        Table& table = shards_[ShardOf(h)].tables[t];
        if (!stored) {
          uint64_t* word = table.Find(h);
          if (word == nullptr || (*word & bit) == 0) continue;
          *word &= ~bit;
          if (*word == 0) table.Erase(word);
          ++changed;
          continue;
        }
        bool found = false;
        uint64_t* word = table.FindOrSlot(h, &found);
        if (found) {
          if ((*word & bit) == 0) {
            *word |= bit;
            ++changed;
          }
        } else if (word != nullptr) {
          *word = bit;
          table.Inserted(h, word);
          ++changed;
        } else if (MakeRoom(table)) {  // full: grow within the cap, then insert
          table.Insert(h, bit);
          ++changed;
        } else {
          ++dropped;
        }
      }
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
  for (size_t s = 0; s < kShards; ++s) {
    absl::MutexLock lock(&mu_);  // a shard at a time
    Shard& shard = shards_[s];
    for (size_t t = 2 * group; t < 2 * group + 2 && t < shard.tables.size(); ++t) {
      Table& table = shard.tables[t];
      table.EraseIf([&](uint64_t, uint64_t& word) {
        if ((word & bit) == 0) return false;
        ++removed;
        word &= ~bit;
        return word == 0;
      });
      MaybeShrink(table);
    }
  }
  blocks_[slot].store(0);
  entries_.fetch_sub(removed);
}

void KvIndex::Match(absl::Span<const Hash128> chain, std::vector<int32_t>* prefix) const {
  const int n_slots = slot_count_.load();
  if (static_cast<int>(prefix->size()) < n_slots) prefix->resize(n_slots);
  std::fill(prefix->begin(), prefix->end(), 0);
  const int32_t n = static_cast<int32_t>(chain.size());
  const int groups = (n_slots + 63) / 64;
  for (int g = 0; g < groups; ++g) {
    uint64_t alive = group_masks_[g].load(std::memory_order_relaxed);
    if (alive == 0) continue;
    const size_t t = 2 * static_cast<size_t>(g);
    absl::ReaderMutexLock lock(&mu_);
    int32_t i = 0;
    for (; i < n && alive != 0; ++i) {
      const Shard& shard = shards_[ShardOf(chain[i])];
      const uint64_t* word = t < shard.tables.size() ? shard.tables[t].Find(chain[i]) : nullptr;
      const uint64_t bits = word == nullptr ? 0 : *word;
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
  absl::ReaderMutexLock lock(&mu_);
  const Shard& shard = shards_[ShardOf(hash)];
  if (t >= shard.tables.size()) return false;
  const uint64_t* word = shard.tables[t].Find(hash);
  return word != nullptr && (*word & BitOf(slot)) != 0;
}

int64_t KvIndex::entries() const { return entries_.load(); }
int64_t KvIndex::blocks(int slot) const {
  return slot < 0 || slot >= kMaxSlots ? 0 : blocks_[slot].load();
}
uint64_t KvIndex::bytes() const { return bytes_.load(); }
int64_t KvIndex::dropped() const { return dropped_.load(); }
int64_t KvIndex::events() const { return events_.load(); }

}  // namespace ferry
