#include "engine/common/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.threads(), 4);
  for (size_t n : {0u, 1u, 3u, 100u, 10000u}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](size_t i) { hits[i]++; });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  }
}

TEST(ThreadPoolTest, UsesSeveralThreadsAndReusesThem) {
  ThreadPool pool(3);
  std::mutex mu;
  std::condition_variable cv;
  std::set<std::thread::id> ids;
  for (int round = 0; round < 20; ++round) {
    // Every index waits (up to 10 s a call) until a second thread has joined the call, so each
    // call is shared by at least two threads whatever the timing (no sleep standing in for work).
    std::set<std::thread::id> in_call;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    pool.ParallelFor(64, [&](size_t) {
      std::unique_lock<std::mutex> lock(mu);
      in_call.insert(std::this_thread::get_id());
      ids.insert(std::this_thread::get_id());
      cv.notify_all();
      cv.wait_until(lock, deadline, [&] { return in_call.size() >= 2; });
    });
    EXPECT_GE(in_call.size(), 2u) << "call " << round;
  }
  EXPECT_GE(ids.size(), 2u);
  EXPECT_LE(ids.size(), 3u);  // the workers plus the caller, never new threads
}

TEST(ThreadPoolTest, ConcurrentCallersAreServed) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] { pool.ParallelFor(1000, [&](size_t i) { sum += i; }); });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4L * 999 * 1000 / 2);
}

TEST(ThreadPoolTest, NestedCallsRunInlineInsteadOfDeadlocking) {
  ThreadPool pool(3);
  std::atomic<int> inner{0};
  pool.ParallelFor(8, [&](size_t) { pool.ParallelFor(10, [&](size_t) { inner++; }); });
  EXPECT_EQ(inner.load(), 80);
}

TEST(ThreadPoolTest, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  pool.ParallelFor(10, [&](size_t) { EXPECT_EQ(std::this_thread::get_id(), caller); });
}

}  // namespace
}  // namespace ferry
