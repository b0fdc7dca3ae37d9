#include "router/index/block_table.h"

#include <sys/mman.h>

#include <cstring>
#include <new>
#include <utility>

namespace ferry {

void BlockTable::Insert(const Hash128& key, uint64_t word) {
  size_t i = key.lo & mask_;
  while (slots_[i].word != 0) i = (i + 1) & mask_;
  slots_[i].key = key.lo;
  slots_[i].word = word;
  ++size_;
}

void BlockTable::Erase(uint64_t* word) {
  // The slot of `word`, then backward shift: each later key of the run moves into the hole when
  // its home is not between the hole and its slot (cyclically).
  Slot* base = slots_.get();
  size_t hole = static_cast<size_t>(
      reinterpret_cast<Slot*>(reinterpret_cast<char*>(word) - offsetof(Slot, word)) - base);
  for (size_t j = (hole + 1) & mask_; base[j].word != 0; j = (j + 1) & mask_) {
    const size_t home = base[j].key & mask_;
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    base[hole] = base[j];
    hole = j;
  }
  base[hole].word = 0;
  --size_;
}

BlockTable::Slot* BlockTable::Allocate(size_t capacity) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = capacity * sizeof(Slot);
  void* p = nullptr;
  if (bytes >= kHuge) {
    if (posix_memalign(&p, kHuge, bytes) != 0) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
  } else {
    p = std::malloc(bytes);
    if (p == nullptr) throw std::bad_alloc();
  }
  std::memset(p, 0, bytes);
  return static_cast<Slot*>(p);
}

void BlockTable::Rehash(size_t capacity) {
  std::unique_ptr<Slot[], Free> old = std::move(slots_);
  const size_t old_capacity = capacity_;
  slots_.reset(capacity > 0 ? Allocate(capacity) : nullptr);
  capacity_ = capacity;
  mask_ = capacity > 0 ? capacity - 1 : 0;
  size_ = 0;
  for (size_t i = 0; i < old_capacity; ++i) {
    if (old[i].word != 0) Insert(Hash128{old[i].key, 0}, old[i].word);
  }
}

}  // namespace ferry
