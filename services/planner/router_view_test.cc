#include "services/planner/router_view.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

// Pages recorded from a router of `./ferry up --engine sim --prefill 1 --decode 2` (decode workers
// 127.0.0.1:7500 and :7501, prefill 127.0.0.1:7550) under `./ferry load`: during the load, while
// `./ferry scale decode 1 --grace 5s` drained 7501, and after the load.
std::string Testdata(const std::string& name) {
  std::ifstream in("services/planner/testdata/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const ListedWorker* Find(const std::vector<ListedWorker>& workers, const std::string& id) {
  for (const ListedWorker& w : workers) {
    if (w.sample.id == id) return &w;
  }
  return nullptr;
}

TEST(RouterViewTest, ReadsARecordedWorkersPage) {
  auto workers = ParseRouterWorkers(Testdata("workers_pd_under_load.json"));
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 3u);
  const ListedWorker* d = Find(*workers, "127.0.0.1:7500");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->pool, PoolRole::kDecode);
  EXPECT_TRUE(d->sample.ready);
  EXPECT_FALSE(d->sample.draining);
  EXPECT_EQ(d->sample.max_running_requests, 64);
  EXPECT_EQ(d->sample.running_requests, 2);
  EXPECT_EQ(d->sample.running_tokens, 1165);
  EXPECT_EQ(d->sample.block_tokens, 64);
  EXPECT_EQ(d->sample.total_kv_blocks, 728);
  EXPECT_EQ(d->sample.free_kv_blocks, 672);
  EXPECT_EQ(d->sample.cached_kv_blocks, 45);
  EXPECT_EQ(d->sample.inflight, 3);
  EXPECT_EQ(d->sample.active_tokens, 1632);
  EXPECT_EQ(d->last_message_ms_ago, 19);
  EXPECT_NEAR(d->sample.busy_fraction, 0.4825, 1e-4);
  EXPECT_NEAR(d->sample.decode_tokens_per_second, 187.985, 1e-3);
  EXPECT_NEAR(d->sample.step_time_ms, 15.706, 1e-3);
  // KV in use: 728 - 672 - 45 = 11 blocks, less than the 19 the running positions need.
  EXPECT_NEAR(KvUsedFraction(d->sample), 19.0 / 728, 1e-9);
  const ListedWorker* p = Find(*workers, "127.0.0.1:7550");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->pool, PoolRole::kPrefill);
  EXPECT_TRUE(p->sample.ready);
}

TEST(RouterViewTest, ADrainingWorkerIsNotReady) {
  auto workers = ParseRouterWorkers(Testdata("workers_pd_draining.json"));
  ASSERT_TRUE(workers.ok()) << workers.status();
  const ListedWorker* w = Find(*workers, "127.0.0.1:7501");
  ASSERT_NE(w, nullptr);
  EXPECT_TRUE(w->sample.draining);
  EXPECT_FALSE(w->sample.ready);
  EXPECT_TRUE(Find(*workers, "127.0.0.1:7500")->sample.ready);
}

TEST(RouterViewTest, ReadsARecordedMetricsPage) {
  RouterView view;
  ASSERT_TRUE(ParseRouterMetrics(Testdata("metrics_pd_idle.txt"), &view).ok());
  // The recorded page: 64 completions and 2 /v1/models; prompt tokens computed 4704,
  // prefill_memory 30112, store 0 (decode_memory 27232 is a part of those).
  EXPECT_EQ(view.counters.requests, 66);
  EXPECT_EQ(view.counters.computed_prompt_tokens, 4704);
  EXPECT_EQ(view.counters.prompt_tokens, 4704 + 30112);
  EXPECT_EQ(view.counters.completion_tokens, 19200);
  EXPECT_EQ(view.counters.ttft_met, 63);
  EXPECT_EQ(view.counters.ttft_missed, 1);
  EXPECT_EQ(view.counters.itl_met, 64);
  EXPECT_EQ(view.counters.itl_missed, 0);
  EXPECT_EQ(view.queued_requests, 0);
  for (int p = 0; p < kPoolRoles; ++p) EXPECT_EQ(view.queue_wait_count[p], 0);
}

TEST(RouterViewTest, ReadsQueueWaitsAndGauges) {
  RouterView view;
  const std::string page =
      "ferry_router_queue_depth 3\n"
      "ferry_router_queued_tokens 1200\n"
      "ferry_router_queue_wait_seconds_bucket{pool=\"decode\",le=\"1\"} 4\n"
      "ferry_router_queue_wait_seconds_sum{pool=\"decode\"} 2.5\n"
      "ferry_router_queue_wait_seconds_count{pool=\"decode\"} 4\n"
      "ferry_router_queue_wait_seconds_sum{pool=\"prefill\"} 0.25\n"
      "ferry_router_queue_wait_seconds_count{pool=\"prefill\"} 1\n"
      "ferry_router_queue_wait_seconds_count{pool=\"elsewhere\"} 9\n";
  ASSERT_TRUE(ParseRouterMetrics(page, &view).ok());
  EXPECT_EQ(view.queued_requests, 3);
  EXPECT_EQ(view.queued_tokens, 1200);
  EXPECT_EQ(view.queue_wait_count[static_cast<int>(PoolRole::kDecode)], 4);
  EXPECT_DOUBLE_EQ(view.queue_wait_seconds_sum[static_cast<int>(PoolRole::kDecode)], 2.5);
  EXPECT_EQ(view.queue_wait_count[static_cast<int>(PoolRole::kPrefill)], 1);
  EXPECT_EQ(view.queue_wait_count[static_cast<int>(PoolRole::kAggregated)], 0);
}

TEST(RouterViewTest, MergingRoutersSumsCountersAndCountsAWorkerOnce) {
  auto one = ParseRouterView(Testdata("workers_pd_under_load.json"),
                             Testdata("metrics_pd_under_load.txt"));
  auto two = ParseRouterView(Testdata("workers_pd_draining.json"), Testdata("metrics_pd_idle.txt"));
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(two.ok()) << two.status();
  const Snapshot snapshot = MergeRouterViews({*one, *two}, 12.5);
  EXPECT_EQ(snapshot.time_s, 12.5);
  EXPECT_EQ(snapshot.routers, 2);
  EXPECT_EQ(snapshot.counters.requests, one->counters.requests + two->counters.requests);
  EXPECT_EQ(snapshot.counters.computed_prompt_tokens,
            one->counters.computed_prompt_tokens + two->counters.computed_prompt_tokens);
  EXPECT_EQ(snapshot.counters.ttft_met, one->counters.ttft_met + two->counters.ttft_met);
  const PoolSample& decode = snapshot.pool(PoolRole::kDecode);
  ASSERT_EQ(decode.workers.size(), 2u);  // 7500 and 7501, each listed by both routers
  ASSERT_EQ(snapshot.pool(PoolRole::kPrefill).workers.size(), 1u);
  EXPECT_TRUE(snapshot.pool(PoolRole::kAggregated).workers.empty());
  for (const WorkerSample& w : decode.workers) {
    const ListedWorker* a = Find(one->workers, w.id);
    const ListedWorker* b = Find(two->workers, w.id);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    // The routers' own counts add up; the load is the fresher report's.
    EXPECT_EQ(w.inflight, a->sample.inflight + b->sample.inflight);
    EXPECT_EQ(w.active_tokens, a->sample.active_tokens + b->sample.active_tokens);
    const ListedWorker* fresher = a->last_message_ms_ago <= b->last_message_ms_ago ? a : b;
    EXPECT_EQ(w.running_tokens, fresher->sample.running_tokens) << w.id;
    // Draining as either router sees it.
    EXPECT_EQ(w.draining, a->sample.draining || b->sample.draining);
    EXPECT_EQ(w.ready, !w.draining);
  }
}

TEST(RouterViewTest, SkipsRemovedWorkersAndWorkersWithNoRoleYet) {
  const std::string page = R"([
    {"id": "a:1", "address": "a:1", "state": "connecting", "accepted": false, "messages": 0},
    {"id": "b:1", "address": "b:1", "state": "removed", "accepted": false, "reason": "gone"},
    {"id": "c:1", "state": "down", "role": "aggregated", "accepted": false,
     "drain_state": "DRAIN_STATE_SERVING", "load": {"busy_fraction": 1.5}}
  ])";
  auto workers = ParseRouterWorkers(page);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].pool, PoolRole::kAggregated);
  EXPECT_FALSE((*workers)[0].sample.ready);            // down
  EXPECT_EQ((*workers)[0].sample.busy_fraction, 1.0);  // at most 1
}

TEST(RouterViewTest, OddPagesAreErrorsNotCrashes) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::string many = "[";
  for (size_t i = 0; i <= kMaxWorkersListed; ++i) many += (i ? ",{}" : "{}");
  many += "]";
  for (const std::string& page : {
           std::string(""),
           std::string("not json"),
           std::string("{}"),
           std::string("[1]"),
           deep,
           many,
           std::string(R"([{"id": 7}])"),
           std::string(R"([{"id": "a", "role": "decode", "inflight": -1}])"),
           std::string(R"([{"id": "a", "role": "decode", "inflight": 1.5}])"),
           std::string(R"([{"id": "a", "role": "decode", "inflight": 1e300}])"),
           std::string(R"([{"id": "a", "role": "decode", "inflight": 18446744073709551615}])"),
           std::string(R"([{"id": "a", "role": "decode", "load": []}])"),
           std::string(R"([{"id": "a", "role": "decode", "load": {"busy_fraction": "x"}}])"),
           std::string(R"([{"id": "a", "role": "decode", "load": {"step_time_ms": -3}}])"),
           std::string(R"([{"id": "a", "role": "chef"}])"),
           std::string(R"([{"role": "decode"}])"),
           std::string(R"([{"id": "a", "role": "decode", "accepted": "yes"}])"),
       }) {
    auto workers = ParseRouterWorkers(page);
    EXPECT_FALSE(workers.ok()) << page.substr(0, 80);
    EXPECT_EQ(workers.status().code(), absl::StatusCode::kInvalidArgument);
  }
  for (const std::string& page : {
           std::string("ferry_router_requests_total{code=\"200\"} -1\n"),
           std::string("ferry_router_requests_total NaN\n"),
           std::string("ferry_router_completion_tokens_total +Inf\n"),
           std::string("ferry_router_queue_depth 1e300\n"),
           std::string("ferry_router_queue_wait_seconds_sum{pool=\"decode\"} -2\n"),
           std::string("ferry_router_queued_tokens{\n"),
       }) {
    RouterView view;
    EXPECT_FALSE(ParseRouterMetrics(page, &view).ok()) << page;
  }
}

}  // namespace
}  // namespace ferry
