// ferry-worker's Watch stream: a snapshot and the events after it reproduce the worker's prefix
// caches exactly after a burst of requests (with evictions; a hybrid model's window cache too),
// with no gap in the numbering; a subscriber that stops reading while the worker moves on gets a
// fresh snapshot when it resumes, while one that reads keeps following the events; a stream
// resumed after a sequence number continues from it; heartbeats arrive while the worker is idle.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

// A fresh snapshot of the worker's caches (the first message(s) of a new stream).
CacheView Snapshot(WorkerClient& client) {
  auto stream = client.Watch(v1::WatchRequest(), absl::Seconds(30));
  CacheView view;
  v1::WorkerStatus status;
  EXPECT_TRUE(stream->Next(&status));
  EXPECT_TRUE(status.snapshot());
  view.Apply(status);
  while (true) {  // the snapshot's other parts, if any
    if (!stream->Next(&status)) break;
    if (!status.snapshot_continues()) break;
    view.Apply(status);
  }
  stream->Cancel();
  stream->Finish();
  return view;
}

struct BurstCase {
  std::string name;
  std::string model;
  std::vector<std::string> flags;
  bool two_pools = false;
};

class WorkerWatchBurstTest : public ::testing::TestWithParam<BurstCase> {};

TEST_P(WorkerWatchBurstTest, SnapshotAndEventsReproduceTheCachesExactly) {
  auto worker = StartWorker(TinyModel(GetParam().model), GetParam().flags);
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  auto stream = client.Watch(v1::WatchRequest(), absl::Seconds(120));
  CacheView view;
  v1::WorkerStatus status;
  ASSERT_TRUE(stream->Next(&status));
  ASSERT_TRUE(status.snapshot());
  view.Apply(status);
  EXPECT_TRUE(view.full.empty());
  EXPECT_NE(status.incarnation(), 0u);
  EXPECT_EQ(status.role(), v1::WORKER_ROLE_AGGREGATED);
  EXPECT_EQ(status.capacity().block_tokens(), 16u);
  EXPECT_EQ(status.protocol_version(), v1::PROTOCOL_VERSION_1);

  // A burst: 12 requests from 4 threads, prompts sharing prefixes, more blocks than the pool.
  std::vector<std::thread> callers;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&, t] {
      WorkerClient mine(worker->address());
      for (int i = 0; i < 3; ++i) {
        std::vector<TokenId> prompt = RandomPrompt(32, t % 2, 512);
        for (TokenId x : RandomPrompt(30 + 10 * i, 100 + 10 * t + i, 512)) prompt.push_back(x);
        Sampling s;
        s.max_tokens = 8;
        s.ignore_eos = true;
        if (mine.Generate(MakeRequest(absl::StrCat("b", t, "-", i), prompt, s), absl::Seconds(60))
                .status.ok()) {
          ++ok;
        }
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(ok.load(), 12);
  // Every request has returned: a fresh snapshot is the worker's final state, and the stream
  // catches up to its sequence (an idle-looking message on it may be from a moment between
  // requests).
  CacheView fresh;
  ASSERT_TRUE(WaitUntilIdle(client, &fresh));
  ASSERT_TRUE(ReadUntilSequence(*stream, &view, fresh.sequence));
  EXPECT_TRUE(view.consistent) << "a gap in the event numbering";
  EXPECT_EQ(view.full, fresh.full);
  EXPECT_EQ(view.window, fresh.window);
  EXPECT_EQ(view.sequence, fresh.sequence);
  EXPECT_FALSE(fresh.full.empty());
  // More blocks were made than the pool holds: some were evicted (reported, and gone).
  EXPECT_GT(fresh.sequence, fresh.full.size() + fresh.window.size());
  EXPECT_EQ(GetParam().two_pools, !fresh.window.empty());
  stream->Cancel();
}

INSTANTIATE_TEST_SUITE_P(
    Models, WorkerWatchBurstTest,
    ::testing::Values(BurstCase{"dense", "llama_gqa_bf16", {"--prefix_cache_bytes=64KiB"}, false},
                      BurstCase{"hybrid_two_pools",
                                "qwen3_hybrid",
                                {"--prefix_cache_bytes=64KiB", "--window_pool_bytes=256KiB",
                                 "--window_cache_bytes=32KiB"},
                                true}),
    [](const auto& info) { return info.param.name; });

TEST(WorkerWatchTest, ASubscriberThatStopsReadingGetsAFreshSnapshotWhenItResumes) {
  // The null engine on the tiny model's tokenizer: fast, with real blocks and hashes, 4 tokens a
  // block. Prefill at 20,000 tokens/s spreads the burst's ~1,900 new blocks over ~0.4 s, so that
  // a subscriber reading every 100 ms never falls 1,024 events behind, and one that reads
  // nothing does: gRPC buffers a few hundred KB for it at most (flow control), less than its
  // first snapshot of ~19,000 hashes.
  auto worker = StartWorker(TinyModel("llama_gqa_bf16"),
                            {"--engine=null", "--null_prefill_tokens_per_second=20000",
                             "--null_token_seconds=0", "--kv_pool_bytes=64MiB", "--block_tokens=4",
                             "--watch_journal_events=1024", "--watch_max_hashes_per_message=1000"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  auto fill = [&](const std::string& prefix, int requests, uint32_t seed) {
    for (int i = 0; i < requests; ++i) {
      Sampling s;
      s.max_tokens = 1;
      ASSERT_TRUE(
          client
              .Generate(MakeRequest(absl::StrCat(prefix, i), RandomPrompt(250, seed + i, 512), s),
                        absl::Seconds(60))
              .status.ok());
    }
  };
  fill("warm", 300, 0);  // ~18,700 cached blocks: a snapshot of ~350 KB

  // A subscriber on a channel that does not buffer ahead (no BDP probing), which reads nothing for
  // now; and one that reads all the time.
  WorkerClient slow_client(worker->address(), "",
                           {{"grpc.http2.bdp_probe", 0}, {"grpc.http2.lookahead_bytes", 1024}});
  auto slow = slow_client.Watch(v1::WatchRequest(), absl::Seconds(120));
  CacheView reader_view;
  std::atomic<bool> stop{false};
  std::atomic<int> reader_snapshots{0};
  std::mutex caught_up_mu;
  std::condition_variable caught_up_cv;
  bool reader_caught_up = false;  // a whole message past its snapshot
  auto reader = client.Watch(v1::WatchRequest(), absl::Seconds(120));
  std::thread reading([&] {
    v1::WorkerStatus status;
    while (!stop && reader->Next(&status)) {
      if (status.snapshot()) ++reader_snapshots;
      reader_view.Apply(status);
      if (!status.snapshot() && !status.snapshot_continues()) {
        std::lock_guard<std::mutex> lock(caught_up_mu);
        reader_caught_up = true;
        caught_up_cv.notify_all();
      }
    }
  });
  {
    std::unique_lock<std::mutex> lock(caught_up_mu);
    caught_up_cv.wait_for(lock, std::chrono::seconds(10), [&] { return reader_caught_up; });
    ASSERT_TRUE(reader_caught_up);
  }
  fill("burst", 30, 1000);  // ~63 blocks a request, ~1,900 in all: more than the journal keeps

  // The slow subscriber resumes: it sees its first snapshot (taken before the burst), then,
  // having missed events the journal no longer holds, a fresh one; its state ends equal to the
  // worker's.
  ASSERT_TRUE(WaitUntilIdle(client));
  const CacheView fresh = Snapshot(client);
  CacheView slow_view;
  int slow_snapshots = 0;
  v1::WorkerStatus status;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  // Until a plain message (no snapshot part follows it) at the fresh snapshot's sequence.
  bool caught_up = false;
  while (!caught_up && absl::Now() < deadline && slow->Next(&status)) {
    if (status.snapshot()) ++slow_snapshots;
    slow_view.Apply(status);
    caught_up =
        !status.snapshot() && !status.snapshot_continues() && slow_view.sequence >= fresh.sequence;
  }
  ASSERT_TRUE(caught_up);
  EXPECT_EQ(slow_view.sequence, fresh.sequence);
  EXPECT_EQ(slow_view.full, fresh.full);
  EXPECT_EQ(slow_snapshots, 2);
  EXPECT_EQ(
      MetricValue(worker->admin_port(), "ferry_worker_watch_snapshots_total{reason=\"lagged\"}"),
      1);
  stop = true;
  reader->Cancel();
  reading.join();
  EXPECT_EQ(reader_snapshots.load(), 1) << "the reading subscriber needed no second snapshot";
  EXPECT_TRUE(reader_view.consistent);
  EXPECT_EQ(reader_view.full, fresh.full);
  slow->Cancel();
}

TEST(WorkerWatchTest, AResumedStreamContinuesAfterItsSequenceAndHeartbeatsArriveWhileIdle) {
  auto worker = StartWorker(TinyModel("llama_gqa_bf16"),
                            {"--watch_interval=50ms", "--watch_heartbeat=200ms"});
  ASSERT_TRUE(worker->ready());
  WorkerClient client(worker->address());
  Sampling s;
  s.max_tokens = 4;
  ASSERT_TRUE(client.Generate(MakeRequest("one", RandomPrompt(50, 1, 512), s), absl::Seconds(60))
                  .status.ok());
  ASSERT_TRUE(WaitUntilIdle(client));
  const CacheView before = Snapshot(client);
  uint64_t incarnation = 0;
  {
    auto stream = client.Watch(v1::WatchRequest(), absl::Seconds(30));
    v1::WorkerStatus status;
    ASSERT_TRUE(stream->Next(&status));
    incarnation = status.incarnation();
    stream->Cancel();
    stream->Finish();
  }
  ASSERT_TRUE(client.Generate(MakeRequest("two", RandomPrompt(50, 2, 512), s), absl::Seconds(60))
                  .status.ok());

  // After `before.sequence`, same incarnation: no snapshot, only what happened since.
  v1::WatchRequest resume;
  resume.set_after_sequence(before.sequence);
  resume.set_incarnation(incarnation);
  auto stream = client.Watch(resume, absl::Seconds(30));
  CacheView view = before;
  v1::WorkerStatus status;
  ASSERT_TRUE(stream->Next(&status));
  EXPECT_FALSE(status.snapshot());
  view.Apply(status);
  ASSERT_TRUE(WaitUntilIdle(*stream, &view));
  EXPECT_TRUE(view.consistent);
  EXPECT_EQ(view.full, Snapshot(client).full);
  EXPECT_GT(view.sequence, before.sequence);

  // Idle now: heartbeats, each with the same sequence and no events.
  int heartbeats = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (heartbeats < 3 && absl::Now() < deadline && stream->Next(&status)) {
    if (!status.heartbeat()) continue;
    ++heartbeats;
    EXPECT_EQ(status.kv_events_size(), 0);
    EXPECT_EQ(status.sequence(), view.sequence);
  }
  EXPECT_EQ(heartbeats, 3);
  stream->Cancel();

  // Another incarnation's sequence number: a snapshot instead.
  resume.set_incarnation(incarnation + 1);
  auto other = client.Watch(resume, absl::Seconds(30));
  ASSERT_TRUE(other->Next(&status));
  EXPECT_TRUE(status.snapshot());
  other->Cancel();
}

}  // namespace
}  // namespace ferry
