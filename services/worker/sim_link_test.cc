// The simulated link: processor sharing computed exactly over explicit times (LinkShares), and
// SimLink on real time with lower bounds only (a transfer is never early; sharing slows it).

#include "services/worker/sim_link.h"

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using Served = std::vector<std::pair<uint64_t, double>>;

TEST(LinkSharesTest, EachTransferGetsAnEqualShareFromWhenItJoins) {
  LinkShares link(100);  // bytes a second
  Served served;
  link.Add(1, 100, 0, &served);
  EXPECT_DOUBLE_EQ(link.NextFinish(), 1.0);  // alone: 100 bytes at 100/s
  // At 0.5 A has 50 bytes left; B joins with 30: each now gets 50/s.
  link.Add(2, 30, 0.5, &served);
  EXPECT_TRUE(served.empty());
  EXPECT_EQ(link.active(), 2);
  EXPECT_DOUBLE_EQ(link.NextFinish(), 0.5 + 30.0 / 50);  // B first
  // B is done at 1.1 (A has 20 left), A alone again at 100/s: done at 1.3.
  link.Advance(2.0, &served);
  ASSERT_EQ(served.size(), 2u);
  EXPECT_EQ(served[0].first, 2u);
  EXPECT_NEAR(served[0].second, 1.1, 1e-12);
  EXPECT_EQ(served[1].first, 1u);
  EXPECT_NEAR(served[1].second, 1.3, 1e-12);
  EXPECT_EQ(link.active(), 0);
  EXPECT_EQ(link.NextFinish(), std::numeric_limits<double>::infinity());
}

TEST(LinkSharesTest, EqualTransfersTogetherTakeSharingTimesLonger) {
  // SimTiming::TransferSeconds(tokens, n) without the latency: n x bytes / bandwidth.
  LinkShares link(1000);
  Served served;
  for (uint64_t id = 1; id <= 4; ++id) link.Add(id, 500, 10, &served);
  link.Advance(11.9, &served);
  EXPECT_TRUE(served.empty());  // 4 x 500 / 1000 = 2 s
  link.Advance(12.5, &served);
  ASSERT_EQ(served.size(), 4u);
  for (const auto& [id, at] : served) EXPECT_NEAR(at, 12.0, 1e-12) << id;
}

TEST(LinkSharesTest, ALeaverSpeedsUpTheOthersAndNoBandwidthIsInstant) {
  LinkShares link(100);
  Served served;
  link.Add(1, 100, 0, &served);
  link.Add(2, 100, 0, &served);
  // At 1.0 each has 50 left; 2 leaves unserved: 1 is alone, done at 1.5.
  EXPECT_TRUE(link.Remove(2, 1.0, &served));
  EXPECT_FALSE(link.Remove(2, 1.0, &served));
  EXPECT_DOUBLE_EQ(link.NextFinish(), 1.5);
  link.Advance(3, &served);
  ASSERT_EQ(served.size(), 1u);
  EXPECT_DOUBLE_EQ(served[0].second, 1.5);

  LinkShares instant(0);
  served.clear();
  instant.Add(7, 1e12, 4, &served);
  EXPECT_DOUBLE_EQ(instant.NextFinish(), 4);
  instant.Advance(4, &served);
  ASSERT_EQ(served.size(), 1u);
  EXPECT_EQ(served[0], (std::pair<uint64_t, double>{7, 4}));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(SimLinkTest, TransfersTakeAtLeastTheirShareOfTheLinkPlusLatency) {
  SimLink link(1e6, 0.002);  // 1 MB/s: 10 kB in 10 ms
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(link.Transfer(10000, absl::InfiniteFuture()));
  EXPECT_GE(SecondsSince(start), 0.012);
  // Four at once: 40 kB through the link; the last is done no earlier than 40 ms + latency after
  // the first started, and none before a lone one would be.
  start = std::chrono::steady_clock::now();
  std::vector<double> took(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      const auto mine = std::chrono::steady_clock::now();
      EXPECT_TRUE(link.Transfer(10000, absl::InfiniteFuture()));
      took[i] = SecondsSince(mine);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GE(SecondsSince(start), 0.042);
  for (double t : took) EXPECT_GE(t, 0.012);
  EXPECT_EQ(link.in_flight(), 0);
}

TEST(SimLinkTest, StartReturnsAtOnceAndTheCallbackComesWhenServed) {
  SimLink link(1e6, 0);
  absl::Notification done;
  std::atomic<bool> served{false};
  const auto start = std::chrono::steady_clock::now();
  std::atomic<double> at{0};
  link.Start(20000, absl::InfiniteFuture(), [&](bool ok) {
    at = SecondsSince(start);
    served = ok;
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_TRUE(served);
  EXPECT_GE(at.load(), 0.02);
}

TEST(SimLinkTest, DeadlinesAndDestructionEndTransfersUnserved) {
  auto link = std::make_unique<SimLink>(1000, 0);  // 1 kB/s
  // A megabyte would take 1000 s: the deadline ends it.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(link->Transfer(1e6, absl::Now() + absl::Milliseconds(20)));
  EXPECT_GE(SecondsSince(start), 0.019);
  // A deadline already past: at once, unserved.
  EXPECT_FALSE(link->Transfer(1, absl::Now() - absl::Seconds(1)));
  // Still in flight when the link goes: the callback says unserved.
  absl::Notification done;
  bool served = true;
  link->Start(1e9, absl::InfiniteFuture(), [&](bool ok) {
    served = ok;
    done.Notify();
  });
  EXPECT_EQ(link->in_flight(), 1);
  link.reset();
  ASSERT_TRUE(done.HasBeenNotified());
  EXPECT_FALSE(served);
}

}  // namespace
}  // namespace ferry
