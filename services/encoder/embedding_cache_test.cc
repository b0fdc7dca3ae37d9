// EmbeddingCache (cap, LRU, pins, TTL under a FakeClock, Release, the handle bound),
// SingleFlight (one leader, every waiter answered, AllGone) and BoundedExecutor (the queue bound,
// WaitIdle).

#include "services/encoder/embedding_cache.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"
#include "services/encoder/bounded_executor.h"
#include "services/encoder/single_flight.h"

namespace ferry {
namespace {

// Rows of `floats` floats (4 bytes each), all `value`.
EmbeddingRows Rows(int floats, float value = 1.0f) {
  return std::make_shared<const std::vector<float>>(floats, value);
}

Hash128 Key(uint64_t n) { return Hash128{n, ~n}; }

struct CacheTest : ::testing::Test {
  FakeClock clock;
  std::unique_ptr<EmbeddingCache> Make(int64_t capacity, absl::Duration ttl = absl::Seconds(10),
                                       int64_t max_handles = 1000) {
    EmbeddingCacheOptions o;
    o.capacity_bytes = capacity;
    o.ttl = ttl;
    o.max_handles = max_handles;
    o.clock = &clock;
    return std::make_unique<EmbeddingCache>(o);
  }
};

TEST_F(CacheTest, PutPinGetRelease) {
  auto cache = Make(1000);
  EXPECT_EQ(cache->Pin(Key(1)).status().code(), absl::StatusCode::kNotFound);
  auto a = cache->Put(Key(1), Rows(10, 2.0f));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size_bytes, 40);
  EXPECT_EQ(a->handle.size(), 32u);
  EXPECT_EQ(a->expires, clock.Now() + absl::Seconds(10));
  auto rows = cache->Get(a->handle);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ((**rows)[9], 2.0f);
  // A second handle on the same entry; a Put of the same key keeps the first rows.
  auto b = cache->Put(Key(1), Rows(10, 3.0f));
  ASSERT_TRUE(b.ok());
  EXPECT_NE(a->handle, b->handle);
  EXPECT_EQ((**cache->Get(b->handle))[0], 2.0f);
  auto c = cache->Pin(Key(1));
  ASSERT_TRUE(c.ok());
  EmbeddingCacheStats s = cache->Stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.bytes, 40);
  EXPECT_EQ(s.pinned_bytes, 40);
  EXPECT_EQ(s.handles, 3);
  EXPECT_TRUE(cache->Release(a->handle));
  EXPECT_FALSE(cache->Release(a->handle));
  EXPECT_EQ(cache->Get(a->handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cache->Get(b->handle).ok());
  EXPECT_TRUE(cache->Release(b->handle));
  EXPECT_TRUE(cache->Release(c->handle));
  s = cache->Stats();
  EXPECT_EQ(s.handles, 0);
  EXPECT_EQ(s.pinned_bytes, 0);
  EXPECT_EQ(s.bytes, 40);  // still cached: a later Encode is a hit
  EXPECT_TRUE(cache->Pin(Key(1)).ok());
  EXPECT_EQ(cache->Get("not a handle").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CacheTest, TtlExpiresHandlesNotEntries) {
  auto cache = Make(1000, absl::Seconds(5));
  auto a = cache->Put(Key(1), Rows(10));
  ASSERT_TRUE(a.ok());
  clock.Advance(absl::Seconds(3));
  auto b = cache->Pin(Key(1));
  ASSERT_TRUE(b.ok());
  clock.Advance(absl::Seconds(2));  // a's TTL has passed (expiry is inclusive), b's has not
  EXPECT_EQ(cache->Get(a->handle).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cache->Get(b->handle).ok());
  EXPECT_FALSE(cache->Release(a->handle));
  clock.Advance(absl::Seconds(3));
  EmbeddingCacheStats s = cache->Stats();
  EXPECT_EQ(s.handles, 0);
  EXPECT_EQ(s.pinned_bytes, 0);
  EXPECT_EQ(s.expired_handles, 2);
  EXPECT_EQ(s.entries, 1);
}

TEST_F(CacheTest, LruEvictionUnderTheCapSkipsPinnedEntries) {
  auto cache = Make(120);  // three entries of 40 bytes
  auto h1 = cache->Put(Key(1), Rows(10));
  auto h2 = cache->Put(Key(2), Rows(10));
  auto h3 = cache->Put(Key(3), Rows(10));
  ASSERT_TRUE(h1.ok() && h2.ok() && h3.ok());
  ASSERT_TRUE(cache->Release(h2->handle));
  ASSERT_TRUE(cache->Release(h3->handle));
  // Entry 1 is the least recently used, but pinned: 2 goes (3 was used after it).
  ASSERT_TRUE(cache->Put(Key(4), Rows(10)).ok());
  EXPECT_TRUE(cache->Pin(Key(1)).ok());
  EXPECT_EQ(cache->Pin(Key(2)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cache->Pin(Key(3)).ok());
  EXPECT_EQ(cache->Stats().evicted, 1);
  EXPECT_EQ(cache->Stats().bytes, 120);
}

TEST_F(CacheTest, LruOrderFollowsUse) {
  auto cache = Make(80);
  auto h1 = cache->Put(Key(1), Rows(10));
  auto h2 = cache->Put(Key(2), Rows(10));
  ASSERT_TRUE(cache->Release(h1->handle));
  ASSERT_TRUE(cache->Release(h2->handle));
  auto again = cache->Pin(Key(1));  // 1 becomes the most recently used
  ASSERT_TRUE(cache->Release(again->handle));
  ASSERT_TRUE(cache->Put(Key(3), Rows(10)).ok());
  EXPECT_TRUE(cache->Pin(Key(1)).ok());
  EXPECT_FALSE(cache->Pin(Key(2)).ok());
}

TEST_F(CacheTest, PinnedBytesFillingTheCapRefuseNewEntries) {
  auto cache = Make(100);
  auto h1 = cache->Put(Key(1), Rows(10));
  auto h2 = cache->Put(Key(2), Rows(10));
  ASSERT_TRUE(h1.ok() && h2.ok());
  auto refused = cache->Put(Key(3), Rows(10));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("pinned"), std::string::npos);
  EXPECT_EQ(cache->Stats().entries, 2);                    // nothing evicted for it
  EXPECT_EQ(cache->Put(Key(4), Rows(30)).status().code(),  // larger than the cap
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(cache->Release(h1->handle));
  EXPECT_TRUE(cache->Put(Key(3), Rows(10)).ok());
  EXPECT_FALSE(cache->Pin(Key(1)).ok());
}

TEST_F(CacheTest, HandleBound) {
  auto cache = Make(1000, absl::Seconds(10), 2);
  ASSERT_TRUE(cache->Put(Key(1), Rows(1)).ok());
  ASSERT_TRUE(cache->Pin(Key(1)).ok());
  EXPECT_EQ(cache->Pin(Key(1)).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(cache->Put(Key(2), Rows(1)).status().code(), absl::StatusCode::kResourceExhausted);
  clock.Advance(absl::Seconds(10));
  EXPECT_TRUE(cache->Pin(Key(1)).ok());
}

TEST(SingleFlightTest, OneLeaderEveryWaiterAnswered) {
  SingleFlight<Hash128, int> flights;
  std::vector<int> got;
  auto waiter = [&](bool gone) {
    return SingleFlight<Hash128, int>::Waiter{
        [&](const absl::StatusOr<int>& v) { got.push_back(v.ok() ? *v : -1); },
        [gone] { return gone; }};
  };
  EXPECT_TRUE(flights.Join(Key(1), waiter(true)));
  EXPECT_TRUE(flights.AllGone(Key(1)));
  EXPECT_FALSE(flights.Join(Key(1), waiter(false)));
  EXPECT_FALSE(flights.AllGone(Key(1)));
  EXPECT_TRUE(flights.Join(Key(2), waiter(false)));
  EXPECT_EQ(flights.in_flight(), 2u);
  flights.Complete(Key(1), 7);
  EXPECT_EQ(got, (std::vector<int>{7, 7}));
  flights.Complete(Key(2), absl::InternalError("x"));
  EXPECT_EQ(got, (std::vector<int>{7, 7, -1}));
  EXPECT_EQ(flights.in_flight(), 0u);
  EXPECT_TRUE(flights.Join(Key(1), waiter(false)));  // leads again
  EXPECT_FALSE(flights.AllGone(Key(3)));
}

TEST(BoundedExecutorTest, QueueBoundAndWaitIdle) {
  BoundedExecutor executor(1, 2);
  absl::Notification started, release;
  std::atomic<int> ran{0};
  ASSERT_TRUE(executor.TrySubmit([&] {
    started.Notify();
    release.WaitForNotification();
    ++ran;
  }));
  started.WaitForNotification();
  EXPECT_EQ(executor.running(), 1);
  EXPECT_TRUE(executor.TrySubmit([&] { ++ran; }));
  EXPECT_TRUE(executor.TrySubmit([&] { ++ran; }));
  EXPECT_FALSE(executor.TrySubmit([&] { ++ran; }));  // two already wait
  EXPECT_EQ(executor.queued(), 2);
  EXPECT_FALSE(executor.WaitIdle(absl::Now()));
  release.Notify();
  EXPECT_TRUE(executor.WaitIdle(absl::InfiniteFuture()));
  EXPECT_EQ(ran.load(), 3);
}

}  // namespace
}  // namespace ferry
