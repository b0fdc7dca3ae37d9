#include "kvstore/service/staging_area.h"

#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/log.h"

namespace ferry {
namespace kv {
namespace {

size_t RoundUp(size_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

// The part of `memory` that starts on a kStagingAlignment boundary.
char* AlignedBase(absl::Span<char> memory) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(memory.data());
  const uintptr_t skip = (kStagingAlignment - begin % kStagingAlignment) % kStagingAlignment;
  return memory.data() + (skip < memory.size() ? skip : memory.size());
}

}  // namespace

StagingArea::StagingArea(absl::Span<char> memory)
    : base_(AlignedBase(memory)),
      capacity_((memory.size() - static_cast<size_t>(base_ - memory.data())) / kStagingAlignment *
                kStagingAlignment) {
  absl::MutexLock lock(&mu_);
  if (capacity_ > 0) free_[0] = capacity_;
}

size_t StagingArea::FindRoom(size_t bytes) const {
  for (const auto& [offset, length] : free_) {
    if (length >= bytes) return offset;
  }
  return capacity_;
}

absl::StatusOr<absl::Span<char>> StagingArea::Acquire(size_t bytes, absl::Time deadline,
                                                      bool* waited) {
  if (waited != nullptr) *waited = false;
  if (bytes == 0 || bytes > capacity_) {
    return absl::OutOfRangeError(
        absl::StrCat(bytes, " bytes do not fit a staging area of ", capacity_, " bytes"));
  }
  const size_t rounded = RoundUp(bytes);
  absl::MutexLock lock(&mu_);
  size_t offset = FindRoom(rounded);
  if (offset == capacity_) {
    if (waited != nullptr) *waited = true;
    auto room = [this, rounded]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return FindRoom(rounded) != capacity_; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&room), deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("no room for ", bytes,
                                                      " bytes in the staging area before the "
                                                      "deadline (",
                                                      used_, " of ", capacity_, " in use)"));
    }
    offset = FindRoom(rounded);
  }
  auto it = free_.find(offset);
  const size_t length = it->second;
  free_.erase(it);
  if (length > rounded) free_[offset + rounded] = length - rounded;
  used_ += rounded;
  return absl::Span<char>(base_ + offset, bytes);
}

void StagingArea::Release(absl::Span<char> slot) {
  CHECK(slot.data() >= base_ && slot.data() + slot.size() <= base_ + capacity_)
      << "a slot that is not the staging area's";
  size_t offset = static_cast<size_t>(slot.data() - base_);
  size_t length = RoundUp(slot.size());
  absl::MutexLock lock(&mu_);
  used_ -= length;
  auto next = free_.lower_bound(offset);
  CHECK(next == free_.end() || next->first >= offset + length) << "a slot released twice";
  if (next != free_.end() && next->first == offset + length) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    CHECK(prev->first + prev->second <= offset) << "a slot released twice";
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return;
    }
  }
  free_[offset] = length;
}

size_t StagingArea::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace kv
}  // namespace ferry
