#include "engine/backends/cuda/device_pool.h"

#include <cstdio>
#include <cstdlib>

namespace ferry::cuda {
namespace {

size_t AlignUp(size_t n) {
  return (n + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
}

}  // namespace

DevicePool::DevicePool(Source source, size_t slab_bytes, size_t limit_bytes)
    : source_(std::move(source)), slab_bytes_(AlignUp(slab_bytes)), limit_bytes_(limit_bytes) {}

DevicePool::~DevicePool() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Slab& s : slabs_) {
    if (s.base != 0) source_.release(reinterpret_cast<void*>(s.base), s.bytes);
  }
}

void* DevicePool::Allocate(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return AllocateLocked(AlignUp(bytes == 0 ? 1 : bytes));
}

void* DevicePool::AllocateLocked(size_t bytes) {
  // Best fit over every slab's free ranges.
  size_t best_slab = slabs_.size(), best_offset = 0, best_length = 0;
  for (size_t i = 0; i < slabs_.size(); ++i) {
    for (const auto& [offset, length] : slabs_[i].free) {
      if (length >= bytes && (best_slab == slabs_.size() || length < best_length)) {
        best_slab = i;
        best_offset = offset;
        best_length = length;
      }
    }
  }
  if (best_slab == slabs_.size()) {
    // An ordinary slab, or a piece's own; near the limit, what is left of it if that is enough.
    const size_t left =
        limit_bytes_ > stats_.reserved_bytes ? limit_bytes_ - stats_.reserved_bytes : 0;
    size_t want = bytes > slab_bytes_ ? bytes : slab_bytes_;
    if (want > left && bytes <= left) want = left / kDeviceAlignment * kDeviceAlignment;
    if (want < bytes || stats_.reserved_bytes + want > limit_bytes_) return nullptr;
    void* data = source_.reserve(want);
    if (data == nullptr) return nullptr;
    // Reuse an empty slot left by Trim.
    size_t slot = slabs_.size();
    for (size_t i = 0; i < slabs_.size(); ++i) {
      if (slabs_[i].base == 0) slot = i;
    }
    if (slot == slabs_.size()) slabs_.emplace_back();
    Slab& s = slabs_[slot];
    s.base = reinterpret_cast<uintptr_t>(data);
    s.bytes = want;
    s.free = {{0, want}};
    s.used = 0;
    stats_.reserved_bytes += want;
    ++stats_.slabs;
    best_slab = slot;
    best_offset = 0;
    best_length = want;
  }
  Slab& s = slabs_[best_slab];
  s.free.erase(best_offset);
  if (best_length > bytes) s.free[best_offset + bytes] = best_length - bytes;
  s.used += bytes;
  const uintptr_t address = s.base + best_offset;
  pieces_[address] = {best_slab, bytes};
  stats_.in_use_bytes += bytes;
  if (stats_.in_use_bytes > stats_.peak_in_use_bytes) {
    stats_.peak_in_use_bytes = stats_.in_use_bytes;
  }
  ++stats_.pieces;
  return reinterpret_cast<void*>(address);
}

void DevicePool::Free(void* data) {
  if (data == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = pieces_.find(reinterpret_cast<uintptr_t>(data));
  if (it == pieces_.end()) {
    std::fprintf(stderr, "DevicePool::Free: %p was not allocated by this pool\n", data);
    std::abort();
  }
  const auto [slab_index, length] = it->second;
  pieces_.erase(it);
  Slab& s = slabs_[slab_index];
  size_t offset = reinterpret_cast<uintptr_t>(data) - s.base, size = length;
  // Merge with the free range after, then the one before.
  auto next = s.free.lower_bound(offset);
  if (next != s.free.end() && next->first == offset + size) {
    size += next->second;
    next = s.free.erase(next);
  }
  if (next != s.free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      s.free.erase(prev);
    }
  }
  s.free[offset] = size;
  s.used -= length;
  stats_.in_use_bytes -= length;
  --stats_.pieces;
}

void DevicePool::Trim() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Slab& s : slabs_) {
    if (s.base != 0 && s.used == 0) {
      source_.release(reinterpret_cast<void*>(s.base), s.bytes);
      stats_.reserved_bytes -= s.bytes;
      --stats_.slabs;
      s = Slab();
    }
  }
}

DevicePool::Stats DevicePool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace ferry::cuda
