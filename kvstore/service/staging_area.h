// The bounded staging memory of a ferry-kvstore node's KV transport: a Get into a caller's
// transfer descriptor copies each value here (memory the node's transport registered) and puts it
// from here into the caller's memory, so the bytes a node has in flight through its transport are
// bounded by one allocation made at start-up, whatever the number and size of the calls.
//
//   StagingArea staging(region_memory);
//   auto slot = staging.Acquire(value.size(), deadline);   // waits for room, until the deadline
//   memcpy(slot->data(), value.data(), value.size()); post the put from *slot ...
//   staging.Release(*slot);                                // once the put's callback ran
//
// Slots are contiguous ranges, first fit, aligned to kStagingAlignment; freed neighbours merge.
// Waiters are not served in order: a large slot may wait while small ones come and go, bounded
// by its deadline.
//
// Thread-safe. The memory is not owned and must outlive the area.

#ifndef FERRY_KVSTORE_SERVICE_STAGING_AREA_H_
#define FERRY_KVSTORE_SERVICE_STAGING_AREA_H_

#include <cstddef>
#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ferry {
namespace kv {

inline constexpr size_t kStagingAlignment = 64;

class StagingArea {
 public:
  explicit StagingArea(absl::Span<char> memory);
  StagingArea(const StagingArea&) = delete;
  StagingArea& operator=(const StagingArea&) = delete;

  // A slot of exactly `bytes` bytes (its start aligned to kStagingAlignment), waiting for room
  // until `deadline`. OutOfRange when `bytes` is 0 or could never fit (more than the area
  // holds); DeadlineExceeded when no room came in time. `*waited` (if not null) says whether the
  // call found the area too full at first: the bound was hit.
  absl::StatusOr<absl::Span<char>> Acquire(size_t bytes, absl::Time deadline,
                                           bool* waited = nullptr);
  // Gives back a slot Acquire returned (exactly once).
  void Release(absl::Span<char> slot);

  size_t capacity() const { return capacity_; }
  // Bytes held by slots (each rounded up to kStagingAlignment).
  size_t used() const;

 private:
  // The offset of the first free range that holds `bytes`, or capacity_ if none.
  size_t FindRoom(size_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  char* const base_;  // aligned up to kStagingAlignment
  const size_t capacity_;

  mutable absl::Mutex mu_;
  std::map<size_t, size_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> length, never adjacent
  size_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_SERVICE_STAGING_AREA_H_
