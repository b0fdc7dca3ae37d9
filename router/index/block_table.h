// A hash table from block hash to a 64-bit word, for the KV index (kv_index.h): open addressing
// with linear probing over one array of 16-byte slots, a zero word marking an empty slot (the
// index never stores a zero word: a block no worker holds is erased), and backward-shift
// deletion, so there are no tombstones and a table's size in bytes is exactly capacity x 16.
//
// A slot keeps the hash's low 64 bits, not all 128: two blocks whose hashes share them (and, in
// the index, the shard's 4 bits of `hi`) are one key. For n keys in a table a lookup of another
// block errs with probability n / 2^64 (1e-14 for a table of 100k); an error makes the router
// believe one worker holds one more block than it does, for as long as both are held: a routing
// cost off by a block, never a wrong answer (the engine matches its own full hashes).
//
// Block hashes are XXH3 output: the home slot is the low bits of `lo`, no further mixing. The
// load factor stays at most 3/4 (Rehash to GrownCapacity doubles it), so a lookup probes a few
// slots, usually in one cache line. (Software prefetching a batch's slots ahead measured no
// faster on the router bench: out-of-order execution already overlaps independent lookups.)
// An array of 2 MiB or more is
// 2 MiB-aligned and asks for transparent huge pages (madvise): lookups are random over tens of
// megabytes, and with 4 KiB pages most of them would also miss the TLB.
//
// Not thread-safe (the index locks it).

#ifndef FERRY_ROUTER_INDEX_BLOCK_TABLE_H_
#define FERRY_ROUTER_INDEX_BLOCK_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "engine/common/hash128.h"

namespace ferry {

class BlockTable {
 public:
  static constexpr size_t kSlotBytes = 2 * sizeof(uint64_t);
  static constexpr size_t kMinCapacity = 16;

  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  uint64_t bytes() const { return capacity_ * kSlotBytes; }
  // Whether one more key needs a larger array first, and that array's capacity.
  bool Full() const { return (size_ + 1) * 4 > capacity_ * 3; }
  size_t GrownCapacity() const { return capacity_ == 0 ? kMinCapacity : capacity_ * 2; }

  // The key's word, or null when absent. Valid until the next change.
  uint64_t* Find(const Hash128& key) {
    if (capacity_ == 0) return nullptr;
    for (size_t i = key.lo & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.word == 0) return nullptr;
      if (s.key == key.lo) return &s.word;
    }
  }
  const uint64_t* Find(const Hash128& key) const {
    return const_cast<BlockTable*>(this)->Find(key);
  }

  // Adds an absent key with a non-zero word; the table must not be Full().
  void Insert(const Hash128& key, uint64_t word);
  // One probe for both: the key's word if present (`*found` true), else, when the table is not
  // Full(), the word of the empty slot where Insert would put it (`*found` false: set it non-zero
  // and call Inserted(key, word)), else null.
  uint64_t* FindOrSlot(const Hash128& key, bool* found) {
    *found = false;
    if (capacity_ == 0) return nullptr;
    for (size_t i = key.lo & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.word == 0) return Full() ? nullptr : &s.word;
      if (s.key == key.lo) {
        *found = true;
        return &s.word;
      }
    }
  }
  void Inserted(const Hash128& key, uint64_t* word) {
    reinterpret_cast<Slot*>(reinterpret_cast<char*>(word) - offsetof(Slot, word))->key = key.lo;
    ++size_;
  }
  // Removes a present key (its word pointer from Find).
  void Erase(uint64_t* word);
  // Moves every key to an array of `capacity` slots (a power of two that holds them at <= 3/4).
  void Rehash(size_t capacity);
  // Calls fn(key.lo, word&) for every key; fn returns true to erase it.
  template <typename Fn>
  void EraseIf(Fn fn);

 private:
  struct Slot {
    uint64_t key;  // Hash128::lo
    uint64_t word;
  };
  struct Free {
    void operator()(Slot* p) const { std::free(p); }
  };
  // `capacity` zeroed slots (huge pages for a large array).
  static Slot* Allocate(size_t capacity);
  std::unique_ptr<Slot[], Free> slots_;
  size_t capacity_ = 0, mask_ = 0, size_ = 0;
};

template <typename Fn>
void BlockTable::EraseIf(Fn fn) {
  // Backward shifts only move keys towards their home, so a key shifted into a slot already
  // visited would be skipped: visit from a slot that starts a run (an empty one's successor).
  if (capacity_ == 0) return;
  size_t start = 0;
  while (slots_[start].word != 0) start = (start + 1) & mask_;
  for (size_t n = 0, i = (start + 1) & mask_; n < capacity_;) {
    Slot& s = slots_[i];
    if (s.word != 0 && fn(s.key, s.word)) {
      Erase(&s.word);  // a later key of the run may now sit in slot i: look at it again
      continue;
    }
    i = (i + 1) & mask_;
    ++n;
  }
}

}  // namespace ferry

#endif  // FERRY_ROUTER_INDEX_BLOCK_TABLE_H_
