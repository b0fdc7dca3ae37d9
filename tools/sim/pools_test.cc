// The simulator's pools at run time (cluster_sim.h): workers added with a start-up delay, workers
// drained with the drain's KV hand-off, GPU-seconds over each worker's life, the planner's
// snapshot and the router's SLO counters, and the run's driver around them (sim_run.h).

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tools/sim/cluster_sim.h"
#include "tools/sim/event_loop.h"
#include "tools/sim/sim_run.h"

namespace ferry {
namespace {

SimCalibration TestCalibration() {
  SimCalibration c;
  c.name = "test";
  c.kv_bytes_per_token = 1024;
  c.step_overhead_s = 0.001;
  c.prefill_token_s = 1e-4;
  c.prefill_attention_s = 1e-8;
  c.decode_step_s = 0.01;
  c.decode_row_s = 1e-4;
  c.decode_kv_token_s = 1e-7;
  c.link_bandwidth_bytes_per_s = 1e9;
  c.link_latency_s = 1e-4;
  c.store_read_bytes_per_s = 1e9;
  c.store_latency_s = 1e-3;
  return c;
}

ClusterOptions SmallCluster(int aggregated, int prefill, int decode) {
  ClusterOptions o;
  o.aggregated = aggregated;
  o.prefill = prefill;
  o.decode = decode;
  o.calibration = TestCalibration();
  o.worker.kv_pool_bytes = int64_t{64} << 20;  // 64K tokens at 1 KiB a token
  o.worker.vocab_size = 64;
  o.worker.max_batch_tokens = 1024;
  o.worker.prefill_chunk = 1024;
  return o;
}

LoadRequest Request(int64_t id, int64_t prompt_tokens, int64_t max_tokens) {
  LoadRequest r;
  r.id = id;
  for (int64_t i = 0; i < prompt_tokens; ++i) {
    r.prompt.push_back(static_cast<TokenId>(1 + (i * 37 + id * 101) % 60));
  }
  r.max_tokens = max_tokens;
  return r;
}

// The requests' records and every token each received, in order.
struct Outcome {
  std::map<int64_t, RequestRecord> records;
  std::map<int64_t, std::vector<TokenId>> tokens;
};

// Sends `requests`, request i at i x `gap_s`, and runs until they ended; `during` runs first (it
// may schedule).
Outcome RunRequests(ClusterOptions options, const std::vector<LoadRequest>& requests,
                    const std::function<void(EventLoop&, ClusterSim&)>& during,
                    ClusterStats* stats = nullptr, double gap_s = 0) {
  Outcome out;
  options.on_token = [&](int64_t id, TokenId t) { out.tokens[id].push_back(t); };
  EventLoop loop;
  auto cluster = ClusterSim::Create(&loop, options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return out;
  if (during) during(loop, **cluster);
  for (size_t i = 0; i < requests.size(); ++i) {
    loop.At(static_cast<double>(i) * gap_s, [&, i] {
      (*cluster)->Send(requests[i], [&, id = requests[i].id](const RequestRecord& record) {
        out.records[id] = record;
      });
    });
  }
  loop.Run(1000, [&] { return out.records.size() == requests.size(); });
  if (stats != nullptr) *stats = (*cluster)->stats();
  return out;
}

// A worker added at run time takes no request before its start-up time has passed: one worker
// that takes two requests at a time (one running, one waiting) and five long ones, 0.1 s apart;
// the three it cannot take wait in the router's queue until the second worker is ready, 5 s after
// it was added at 1 s.
TEST(SimPoolsTest, AWorkerTakesNoRequestBeforeItsStartUpEnds) {
  ClusterOptions options = SmallCluster(1, 0, 0);
  options.policy = "round_robin";
  options.worker.max_running = 1;
  options.worker.max_queued = 1;  // two requests a worker: the rest wait in the router
  std::vector<LoadRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(Request(i, 300, 1000));  // ~10 s each
  std::vector<Snapshot> seen;
  const Outcome out = RunRequests(
      options, requests,
      [&](EventLoop& loop, ClusterSim& c) {
        loop.At(1, [&] { ASSERT_TRUE(c.AddWorker(WorkerKind::kAggregated, 4).ok()); });
        for (double t : {1.5, 4.99, 5.01}) loop.At(t, [&] { seen.push_back(c.PlannerSnapshot()); });
      },
      nullptr, /*gap_s=*/0.1);
  ASSERT_EQ(out.records.size(), 5u);
  for (const auto& [id, r] : out.records) {
    EXPECT_TRUE(r.ok) << r.error;
    EXPECT_EQ(r.output_tokens, 1000);
  }
  ASSERT_EQ(seen.size(), 3u);
  for (int i = 0; i < 2; ++i) {  // starting: not listed, counted as asked for
    const PoolSample& pool = seen[static_cast<size_t>(i)].pool(PoolRole::kAggregated);
    EXPECT_EQ(pool.starting, 1);
    EXPECT_EQ(pool.spec_replicas, 2);
    ASSERT_EQ(pool.workers.size(), 1u);
    EXPECT_EQ(pool.workers[0].inflight, 2);
    EXPECT_EQ(seen[static_cast<size_t>(i)].queued_requests, 3) << "at " << seen[i].time_s;
  }
  const Snapshot& ready = seen[2];
  EXPECT_EQ(ready.pool(PoolRole::kAggregated).starting, 0);
  ASSERT_EQ(ready.pool(PoolRole::kAggregated).workers.size(), 2u);
  EXPECT_EQ(ready.pool(PoolRole::kAggregated).workers[1].inflight, 2);
  EXPECT_EQ(ready.queued_requests, 1);
  // Only the first request had its first token before the new worker was ready.
  int later = 0;
  for (const auto& [id, r] : out.records) later += r.start_s + r.ttft_s > 5.0 ? 1 : 0;
  EXPECT_EQ(later, 4);
}

// GPU-seconds integrate each worker's life exactly: two workers from 0; one added at 2 (ready at
// 5) and stopped at 4 while still starting (2 s); one added at 6, ready at 7; an idle one drained
// at 8 goes at once (8 s); at 10: 8 + 10 + 2 + 4 worker-seconds, 2 GPUs each.
TEST(SimPoolsTest, GpuSecondsIntegrateEachWorkersLife) {
  EventLoop loop;
  ClusterOptions options = SmallCluster(2, 0, 0);
  options.calibration.gpus_per_worker = 2;
  auto cluster = ClusterSim::Create(&loop, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClusterSim& c = **cluster;
  std::vector<PoolCounts> counts;
  loop.At(2, [&] { ASSERT_TRUE(c.AddWorker(WorkerKind::kAggregated, 3).ok()); });
  loop.At(4, [&] {
    counts.push_back(c.pool_counts(WorkerKind::kAggregated));
    ASSERT_TRUE(c.DrainWorker(WorkerKind::kAggregated).ok());  // the starting one
    counts.push_back(c.pool_counts(WorkerKind::kAggregated));
  });
  loop.At(6, [&] { ASSERT_TRUE(c.AddWorker(WorkerKind::kAggregated, 1).ok()); });
  loop.At(8, [&] {
    counts.push_back(c.pool_counts(WorkerKind::kAggregated));
    ASSERT_TRUE(c.DrainWorker(WorkerKind::kAggregated).ok());  // idle: gone at once
    counts.push_back(c.pool_counts(WorkerKind::kAggregated));
  });
  loop.Run(10);
  EXPECT_DOUBLE_EQ(loop.now(), 10);
  EXPECT_DOUBLE_EQ(c.gpu_seconds(), 2.0 * (8 + 10 + 2 + 4));
  EXPECT_EQ(c.gpus(), 4);
  ASSERT_EQ(counts.size(), 4u);
  EXPECT_EQ(counts[0].starting, 1);
  EXPECT_EQ(counts[0].ready, 2);
  EXPECT_EQ(counts[1].starting, 0);
  EXPECT_EQ(counts[2].ready, 3);
  EXPECT_EQ(counts[3].ready, 2);
  EXPECT_EQ(counts[3].draining, 0);
  EXPECT_EQ(c.stats().workers_gone, 2);
  // The last ready worker of a kind is not drained; a kind the cluster lacks is refused.
  ASSERT_TRUE(c.DrainWorker(WorkerKind::kAggregated).ok());
  EXPECT_EQ(c.DrainWorker(WorkerKind::kAggregated).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c.AddWorker(WorkerKind::kDecode, 1).code(), absl::StatusCode::kInvalidArgument);
}

// A drain hands the streams still running after its grace off with their KV, and every client
// gets the same tokens as without the drain: nothing lost, nothing recomputed (the hand-off's
// bytes are the KV of the prompt and the output so far).
void ExpectDrainKeepsEveryToken(ClusterOptions options, WorkerKind kind) {
  options.policy = "round_robin";
  options.drain_grace_s = 0.3;
  std::vector<LoadRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(Request(i, 200 + 64 * i, 200));
  const Outcome baseline = RunRequests(options, requests, nullptr);
  ClusterStats stats;
  std::vector<PoolCounts> counts;
  double gpu_seconds = 0, end = 0;
  const Outcome drained = RunRequests(
      options, requests,
      [&](EventLoop& loop, ClusterSim& c) {
        loop.At(0.5, [&] {
          ASSERT_TRUE(c.DrainWorker(kind).ok());
          counts.push_back(c.pool_counts(kind));
        });
        loop.At(0.55, [&] { counts.push_back(c.pool_counts(kind)); });
        loop.At(1.5, [&] {
          counts.push_back(c.pool_counts(kind));
          gpu_seconds = c.gpu_seconds();
          end = loop.now();
        });
      },
      &stats);
  ASSERT_EQ(drained.records.size(), requests.size());
  for (const LoadRequest& r : requests) {
    const RequestRecord& record = drained.records.at(r.id);
    EXPECT_TRUE(record.ok) << r.id << ": " << record.error;
    EXPECT_EQ(record.output_tokens, r.max_tokens);
    ASSERT_EQ(drained.tokens.at(r.id).size(), static_cast<size_t>(r.max_tokens));
    EXPECT_EQ(drained.tokens.at(r.id), baseline.tokens.at(r.id)) << "request " << r.id;
  }
  EXPECT_GE(stats.drain_handoffs, 2) << "the drained worker ran streams past its grace";
  EXPECT_EQ(stats.drain_handoff_waits, 0);
  EXPECT_GT(stats.drain_handoff_bytes, stats.drain_handoffs * 200.0 * 1024);
  EXPECT_EQ(stats.workers_drained, 1);
  EXPECT_EQ(stats.workers_gone, 1);
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0].draining, 1);
  EXPECT_EQ(counts[1].draining, 1);  // within its grace, streams still running there
  EXPECT_EQ(counts[2].draining, 0);
  EXPECT_EQ(counts[2].ready, 1);
  const int workers = options.aggregated + options.prefill + options.decode;
  // The drained worker stopped costing once its streams left, after its grace (0.5 + 0.3 s).
  EXPECT_LT(gpu_seconds, workers * end - 0.5);
  EXPECT_GT(gpu_seconds, (workers - 1) * end + 0.8);
}

TEST(SimPoolsTest, DrainingADecodeWorkerHandsItsStreamsOffTokenForToken) {
  ExpectDrainKeepsEveryToken(SmallCluster(0, 1, 2), WorkerKind::kDecode);
}

TEST(SimPoolsTest, DrainingAnAggregatedWorkerHandsItsStreamsOffTokenForToken) {
  ExpectDrainKeepsEveryToken(SmallCluster(2, 0, 0), WorkerKind::kAggregated);
}

// The router's SLO counters judge each request as the load report's goodput does: a request is
// within the SLO (WithinSlo) exactly when it is ok and neither objective was missed.
TEST(SimPoolsTest, SloCountersAgreeWithTheLoadReport) {
  SharedPrefixSpec spec;
  spec.groups = 4;
  spec.prompts_per_group = 8;
  spec.system_tokens = 512;
  spec.question_tokens = 64;
  spec.output_tokens = 16;
  TokenSpace space;
  space.token_base = 1;
  space.token_range = 60;
  const Workload workload = MakeSharedPrefix(spec, space);
  SimRunOptions run;
  run.concurrency = 16;
  auto free_run = RunSimulation(SmallCluster(2, 0, 0), workload, run);
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  // Objectives at the medians: some requests meet each, some miss it.
  run.slo.ttft_s = free_run->summary.ttft_s.p50;
  run.slo.tpot_s = free_run->summary.tpot_s.p50;
  std::vector<Snapshot> snapshots;
  run.scale = [&](ClusterSim&, const Snapshot& s) { snapshots.push_back(s); };
  run.scale_interval_s = 0.2;
  auto result = RunSimulation(SmallCluster(2, 0, 0), workload, run);
  ASSERT_TRUE(result.ok()) << result.status();
  const RouterCounters& k = result->counters;
  int64_t ttft_met = 0, ttft_missed = 0, itl_met = 0, itl_missed = 0, within = 0;
  SloObjectives objectives;
  objectives.ttft = absl::Seconds(run.slo.ttft_s);
  objectives.itl = absl::Seconds(run.slo.tpot_s);
  for (const RequestRecord& r : result->records) {
    const SloJudgement j = JudgeSlo(RouterSloRecord(r), objectives);
    ttft_met += j.ttft == SloResult::kMet;
    ttft_missed += j.ttft == SloResult::kMissed;
    itl_met += j.itl == SloResult::kMet;
    itl_missed += j.itl == SloResult::kMissed;
    const bool judged_within = r.ok && j.ttft != SloResult::kMissed && j.itl != SloResult::kMissed;
    EXPECT_EQ(judged_within, WithinSlo(r, run.slo)) << "request " << r.id;
    within += judged_within;
  }
  EXPECT_EQ(within, result->summary.within_slo);
  EXPECT_GT(within, 0);
  EXPECT_LT(within, 32);
  EXPECT_EQ(k.requests, 32);
  EXPECT_EQ(k.ttft_met, ttft_met);
  EXPECT_EQ(k.ttft_missed, ttft_missed);
  EXPECT_EQ(k.itl_met, itl_met);
  EXPECT_EQ(k.itl_missed, itl_missed);
  EXPECT_GT(k.ttft_missed, 0);
  EXPECT_GT(k.itl_missed, 0);
  EXPECT_EQ(k.prompt_tokens, result->summary.prompt_tokens);
  EXPECT_EQ(k.computed_prompt_tokens,
            result->summary.prompt_tokens - result->summary.cached_tokens);
  EXPECT_EQ(k.completion_tokens, result->summary.output_tokens);
  // The snapshots in between: both workers listed, measured and busy while the load lasted.
  ASSERT_GE(snapshots.size(), 2u);
  const Snapshot& mid = snapshots[snapshots.size() / 2];
  EXPECT_EQ(mid.routers, 1);
  const PoolSample& pool = mid.pool(PoolRole::kAggregated);
  EXPECT_EQ(pool.spec_replicas, 2);
  ASSERT_EQ(pool.workers.size(), 2u);
  for (const WorkerSample& w : pool.workers) {
    EXPECT_TRUE(w.ready);
    EXPECT_GT(w.busy_fraction, 0.5) << w.id;
    EXPECT_LE(w.busy_fraction, 1.0);
    EXPECT_GT(w.decode_tokens_per_second, 0) << w.id;
    EXPECT_GT(w.step_time_ms, 0);
    EXPECT_EQ(w.max_running_requests, 64);
    EXPECT_GT(w.total_kv_blocks, 0);
    EXPECT_GT(w.running_requests, 0);
    EXPECT_GT(w.inflight, 0);
  }
  EXPECT_GT(mid.counters.requests, 0);
  EXPECT_LT(mid.counters.requests, 32);
}

// The run's driver applies a caller's rule every interval (here: a decode worker added at the
// first interval, the first decode worker drained at the third) and reports the pools over time
// and the GPU-seconds the changes cost.
TEST(SimPoolsTest, TheDriverScalesEveryIntervalAndCountsGpuSeconds) {
  SharedPrefixSpec spec;
  spec.groups = 4;
  spec.prompts_per_group = 16;
  spec.system_tokens = 512;
  spec.question_tokens = 64;
  spec.output_tokens = 64;
  TokenSpace space;
  space.token_base = 1;
  space.token_range = 60;
  const Workload workload = MakeSharedPrefix(spec, space);
  SimRunOptions run;
  run.concurrency = 8;
  run.scale_interval_s = 0.5;
  run.startup_s = 0.25;
  int ticks = 0;
  run.scale = [&](ClusterSim& c, const Snapshot&) {
    ++ticks;
    if (ticks == 1) ASSERT_TRUE(c.AddWorker(WorkerKind::kDecode, run.startup_s).ok());
    if (ticks == 3) ASSERT_TRUE(c.DrainWorker(WorkerKind::kDecode).ok());
  };
  ClusterOptions options = SmallCluster(0, 1, 1);
  options.drain_grace_s = 0.1;
  auto result = RunSimulation(options, workload, run);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->summary.ok, 64);
  ASSERT_GE(result->timeline.size(), 4u);
  const auto decode = [&](size_t i) {
    return result->timeline[i].pools[static_cast<size_t>(PoolRole::kDecode)];
  };
  EXPECT_EQ(decode(0).ready, 1);  // before the first rule
  EXPECT_EQ(decode(1).ready, 2);
  EXPECT_EQ(decode(3).ready + decode(3).draining, decode(3).draining > 0 ? 2 : 1);
  EXPECT_EQ(result->cluster.workers_added, 1);
  EXPECT_EQ(result->cluster.workers_gone, 1);
  // Two workers all along, a third from 0.5 s for a while: between 2 and 3 workers' time.
  const double t = result->sim_seconds;
  EXPECT_GT(result->gpu_seconds, 2 * t + 0.5);
  EXPECT_LT(result->gpu_seconds, 3 * t - 0.5);
  EXPECT_DOUBLE_EQ(result->summary.gpu_hours, result->gpu_seconds / 3600);
  // A static run's GPU-hours are unchanged: GPUs x the run's duration.
  SimRunOptions fixed;
  fixed.concurrency = 8;
  auto still = RunSimulation(options, workload, fixed);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_TRUE(still->timeline.empty());
  EXPECT_DOUBLE_EQ(still->summary.gpu_hours, 2 * still->summary.duration_s / 3600);
  EXPECT_NEAR(still->gpu_seconds, 2 * still->sim_seconds, 1e-9);
}

// Churn: workers come and go every interval (a seeded coin per pool: add one with a start-up
// time, or drain one with a short grace) under the bundled trace's first 200 requests, on P/D
// and on aggregated workers. Every request ends ok with the same tokens as on a static cluster:
// hand-offs, restarts and waits lose nothing and change nothing.
void ExpectChurnChangesNoToken(ClusterOptions options, std::vector<WorkerKind> kinds) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  ASSERT_NE(srcdir, nullptr);
  TraceSpec spec;
  spec.path = std::string(srcdir) + "/ferry/tools/sim/testdata/synthetic_trace_head.jsonl";
  spec.time_scale = 0.05;  // 58 s of arrivals in 3 s
  TokenSpace space;
  space.token_base = 1;
  space.token_range = 60;
  auto workload = LoadTrace(spec, space);
  ASSERT_TRUE(workload.ok()) << workload.status();
  options.calibration.prefill_token_s = 2e-5;
  options.drain_grace_s = 0.2;
  std::map<int64_t, std::vector<TokenId>> tokens[2];
  SimRunResult results[2];
  for (int churn = 0; churn < 2; ++churn) {
    ClusterOptions o = options;
    o.on_token = [&, churn](int64_t id, TokenId t) { tokens[churn][id].push_back(t); };
    SimRunOptions run;
    run.mode = "open";
    uint64_t coin = 12345;
    if (churn == 1) {
      run.scale_interval_s = 0.25;
      run.startup_s = 0.3;
      run.scale = [&](ClusterSim& c, const Snapshot&) {
        for (WorkerKind kind : kinds) {
          coin = coin * 6364136223846793005ull + 1442695040888963407ull;
          if ((coin >> 62) == 0) (void)c.AddWorker(kind, run.startup_s);
          if ((coin >> 62) == 1) (void)c.DrainWorker(kind);  // refused for the last one
        }
      };
    }
    auto result = RunSimulation(o, *workload, run);
    ASSERT_TRUE(result.ok()) << result.status();
    results[churn] = *std::move(result);
  }
  const int64_t n = static_cast<int64_t>(workload->requests.size());
  for (int churn = 0; churn < 2; ++churn) {
    EXPECT_EQ(results[churn].summary.ok, n) << "churn " << churn;
    for (const RequestRecord& r : results[churn].records) {
      if (!r.ok) ADD_FAILURE() << "churn " << churn << ", request " << r.id << ": " << r.error;
    }
  }
  for (const LoadRequest& r : workload->requests) {
    EXPECT_EQ(tokens[1][r.id], tokens[0][r.id]) << "request " << r.id;
  }
  const ClusterStats& c = results[1].cluster;
  EXPECT_GT(c.workers_added, 2);
  EXPECT_GT(c.workers_drained, 2);
  EXPECT_GT(c.drain_handoffs, 0);
  std::printf(
      "%lld requests; added %lld, drained %lld, gone %lld workers; %lld hand-offs (%lld "
      "waited); %.3f vs %.3f GPU-seconds static\n",
      static_cast<long long>(n), static_cast<long long>(c.workers_added),
      static_cast<long long>(c.workers_drained), static_cast<long long>(c.workers_gone),
      static_cast<long long>(c.drain_handoffs), static_cast<long long>(c.drain_handoff_waits),
      results[1].gpu_seconds, results[0].gpu_seconds);
}

TEST(SimPoolsTest, ChurnChangesNoTokenDisaggregated) {
  ClusterOptions options = SmallCluster(0, 2, 2);
  ExpectChurnChangesNoToken(options, {WorkerKind::kPrefill, WorkerKind::kDecode});
}

TEST(SimPoolsTest, ChurnChangesNoTokenAggregated) {
  ClusterOptions options = SmallCluster(3, 0, 0);
  options.store = true;
  options.store_bytes = int64_t{1} << 30;
  ExpectChurnChangesNoToken(options, {WorkerKind::kAggregated});
}

}  // namespace
}  // namespace ferry
