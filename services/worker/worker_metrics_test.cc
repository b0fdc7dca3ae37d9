// The utilisation gauges: KV held by requests (bounded by what is not free, at least what the
// prefix cache does not hold), running over max_running, queued tokens; and their export.

#include "services/worker/worker_metrics.h"

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace ferry {
namespace {

EngineStats Stats(int64_t total, int64_t free, int64_t cached, int64_t running_tokens) {
  EngineStats s;
  s.total_blocks = total;
  s.free_blocks = free;
  s.cached_blocks = cached;
  s.running_tokens = running_tokens;
  return s;
}

TEST(WorkerUtilisationTest, KvUsedCountsTheRunningPositionsWithinTheirBounds) {
  // Idle with a full prefix cache: nothing is held by a request.
  EXPECT_EQ(UtilisationOf(Stats(100, 0, 100, 0), 0, 64, 16).kv_used_fraction, 0);
  // 2 running sequences of 100 positions each (200 positions: 13 blocks of 16, rounded up),
  // their full blocks cached: held 13 of 100.
  EXPECT_DOUBLE_EQ(UtilisationOf(Stats(100, 50, 48, 200), 0, 64, 16).kv_used_fraction, 0.13);
  // A decode worker's reservation (not running yet, not cached) counts too.
  EXPECT_DOUBLE_EQ(UtilisationOf(Stats(100, 70, 0, 0), 0, 64, 16).kv_used_fraction, 0.30);
  // Never more than the blocks that are not free (shared prefixes count once per sequence).
  EXPECT_DOUBLE_EQ(UtilisationOf(Stats(100, 90, 10, 16 * 40), 0, 64, 16).kv_used_fraction, 0.10);
  EXPECT_EQ(UtilisationOf(Stats(0, 0, 0, 0), 0, 64, 16).kv_used_fraction, 0);
}

TEST(WorkerUtilisationTest, RunningQueuedAndBusy) {
  EngineStats s;
  s.running = 16;
  s.queued_tokens = 4096;
  const WorkerUtilisation u = UtilisationOf(s, 1.5, 64, 16);
  EXPECT_DOUBLE_EQ(u.running_fraction, 0.25);
  EXPECT_EQ(u.queued_tokens, 4096);
  EXPECT_EQ(u.busy_fraction, 1.0);  // clamped
  EXPECT_EQ(UtilisationOf(s, 0.5, 0, 16).running_fraction, 0);
}

TEST(WorkerUtilisationTest, RefreshSetsTheGauges) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  WorkerUtilisation u;
  u.busy_fraction = 0.75;
  u.kv_used_fraction = 0.5;
  u.running_fraction = 0.25;
  u.queued_tokens = 123;
  metrics.Refresh(EngineStats(), 0, u);
  std::map<std::string, double> got;
  for (const auto& family : registry.Collect()) {
    if (family.metric.size() == 1) got[family.name] = family.metric[0].gauge.value;
  }
  EXPECT_EQ(got["ferry_worker_busy_fraction"], 0.75);
  EXPECT_EQ(got["ferry_worker_kv_used_fraction"], 0.5);
  EXPECT_EQ(got["ferry_worker_running_fraction"], 0.25);
  EXPECT_EQ(got["ferry_worker_queued_tokens"], 123);
}

TEST(WorkerMetricsTest, TheBackendAndItsDeviceMemory) {
  prometheus::Registry registry;
  WorkerMetrics metrics(registry);
  uint64_t used = 100;
  metrics.SetBackend("cuda", "cuda:NVIDIA H100 sm_90", 1000, 2000, [&used] { return used; });
  used = 700;
  metrics.Refresh(EngineStats(), 0, WorkerUtilisation());
  std::map<std::string, double> memory;
  bool info = false;
  for (const auto& family : registry.Collect()) {
    for (const auto& m : family.metric) {
      if (family.name == "ferry_worker_device_memory_bytes") {
        memory[m.label[0].value] = m.gauge.value;
      } else if (family.name == "ferry_worker_backend_info") {
        info = m.gauge.value == 1 && m.label.size() == 2 && m.label[0].value == "cuda" &&
               m.label[1].value == "cuda:NVIDIA H100 sm_90";
      }
    }
  }
  EXPECT_TRUE(info);
  EXPECT_EQ(memory["used"], 700);  // read again at the refresh
  EXPECT_EQ(memory["limit"], 1000);
  EXPECT_EQ(memory["device"], 2000);
}

}  // namespace
}  // namespace ferry
