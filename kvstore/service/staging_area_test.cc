// The staging area's slots: exact sizes at aligned starts, no two overlapping, freed neighbours
// merging back into room for the largest slot, waits for room ending with a release or at the
// deadline, and sizes that can never fit refused at once.

#include "kvstore/service/staging_area.h"

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace kv {
namespace {

class StagingAreaTest : public ::testing::Test {
 protected:
  // 1 KiB past an unaligned start: the area starts at the next 64-byte boundary.
  StagingAreaTest() : memory_(1024 + 2 * kStagingAlignment), area_(Memory()) {}

  absl::Span<char> Memory() {
    char* p = memory_.data();
    const uintptr_t misaligned = reinterpret_cast<uintptr_t>(p) % kStagingAlignment;
    p += (kStagingAlignment - misaligned) % kStagingAlignment + 1;
    return absl::Span<char>(p, 1024 + kStagingAlignment - 1);
  }

  absl::Span<char> MustAcquire(size_t bytes) {
    absl::StatusOr<absl::Span<char>> slot = area_.Acquire(bytes, absl::InfinitePast());
    EXPECT_TRUE(slot.ok()) << bytes << ": " << slot.status();
    return slot.ok() ? *slot : absl::Span<char>();
  }

  std::vector<char> memory_;
  StagingArea area_;
};

TEST_F(StagingAreaTest, SlotsAreAlignedDisjointAndMergeBack) {
  EXPECT_EQ(area_.capacity(), 1024u);
  const absl::Span<char> a = MustAcquire(100);
  const absl::Span<char> b = MustAcquire(1);
  const absl::Span<char> c = MustAcquire(64);
  EXPECT_EQ(a.size(), 100u);
  for (absl::Span<char> s : {a, b, c}) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % kStagingAlignment, 0u);
  }
  EXPECT_EQ(b.data(), a.data() + 128);  // 100 rounded up
  EXPECT_EQ(c.data(), b.data() + 64);
  EXPECT_EQ(area_.used(), 256u);
  // 768 bytes are left after them, so 800 do not fit now.
  EXPECT_EQ(area_.Acquire(800, absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  // Freed in an order that merges a hole with both neighbours: the whole area is one range.
  area_.Release(a);
  area_.Release(c);
  EXPECT_EQ(area_.Acquire(1000, absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  area_.Release(b);
  EXPECT_EQ(area_.used(), 0u);
  const absl::Span<char> all = MustAcquire(1024);
  EXPECT_EQ(all.data(), a.data());
  area_.Release(all);
  // A hole between two slots is reused first fit.
  const absl::Span<char> d = MustAcquire(64);
  const absl::Span<char> e = MustAcquire(64);
  MustAcquire(64);
  area_.Release(e);
  EXPECT_EQ(MustAcquire(10).data(), e.data());
  EXPECT_NE(d.data(), e.data());
}

TEST_F(StagingAreaTest, TooLargeOrEmptyNeverFits) {
  EXPECT_EQ(area_.Acquire(1025, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(area_.Acquire(0, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(area_.used(), 0u);
}

TEST_F(StagingAreaTest, WaitsForRoomUntilAReleaseOrTheDeadline) {
  const absl::Span<char> held = MustAcquire(1000);
  bool waited = false;
  const absl::Time start = absl::Now();
  auto late = area_.Acquire(100, start + absl::Milliseconds(50), &waited);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(waited);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));

  // A waiter gets its slot once another thread releases room.
  absl::Notification started;
  absl::StatusOr<absl::Span<char>> got = absl::UnknownError("not yet");
  std::thread waiter([&] {
    started.Notify();
    got = area_.Acquire(100, absl::Now() + absl::Seconds(30), &waited);
  });
  started.WaitForNotification();
  area_.Release(held);
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), 100u);
  EXPECT_EQ(area_.used(), 128u);
  // Room at once: no wait.
  ASSERT_TRUE(area_.Acquire(64, absl::InfinitePast(), &waited).ok());
  EXPECT_FALSE(waited);
}

}  // namespace
}  // namespace kv
}  // namespace ferry
