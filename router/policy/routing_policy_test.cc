// Routing policies: round_robin spreads evenly; least_loaded follows the router's in-flight
// counts, then the reported tokens, and breaks ties at random (both tied workers get picked);
// prefix_aware (fake workers over a real KV index) sends a conversation back to the worker that
// holds it unless that one is busy, gives a worker of half the speed half the work, follows
// evictions, and predicts what the engine reuses (never a block-aligned prompt's last block).

#include "router/policy/routing_policy.h"

#include <map>
#include <random>

#include "gtest/gtest.h"
#include "router/index/kv_index.h"
#include "router/policy/prefix_aware.h"

namespace ferry {
namespace {

std::vector<WorkerLoadView> Views(std::vector<int64_t> inflight, std::vector<int64_t> tokens = {}) {
  std::vector<WorkerLoadView> v;
  for (size_t i = 0; i < inflight.size(); ++i) {
    WorkerLoadView w;
    w.id = "w" + std::to_string(i);
    w.inflight = inflight[i];
    w.queued_tokens = i < tokens.size() ? tokens[i] : 0;
    v.push_back(w);
  }
  return v;
}

TEST(RoutingPolicyTest, RoundRobinSpreadsEvenly) {
  auto policy = *NewRoutingPolicy("round_robin");
  EXPECT_STREQ(policy->name(), "round_robin");
  std::map<size_t, int> picks;
  const auto views = Views({5, 0, 9});
  for (int i = 0; i < 300; ++i) ++picks[policy->Pick(views, {})];
  EXPECT_EQ(picks[0], 100);
  EXPECT_EQ(picks[1], 100);
  EXPECT_EQ(picks[2], 100);
}

TEST(RoutingPolicyTest, LeastLoadedFollowsLoadAndBreaksTiesAtRandom) {
  auto policy = *NewRoutingPolicy("least_loaded", 42);
  EXPECT_EQ(policy->Pick(Views({3, 1, 2}), {}), 1u);
  EXPECT_EQ(policy->Pick(Views({1, 1, 2}, {500, 100, 0}), {}), 1u);  // fewer tokens
  // A simulated stream of requests: each goes where the fewest are in flight.
  std::vector<int64_t> inflight = {0, 0, 0};
  inflight[0] = 4;  // one worker already busy
  for (int i = 0; i < 8; ++i) ++inflight[policy->Pick(Views(inflight), {})];
  EXPECT_EQ(inflight, (std::vector<int64_t>{4, 4, 4}));
  std::map<size_t, int> ties;
  for (int i = 0; i < 200; ++i) ++ties[policy->Pick(Views({2, 0, 0}), {})];
  EXPECT_EQ(ties[0], 0);
  EXPECT_GT(ties[1], 50);
  EXPECT_GT(ties[2], 50);
  EXPECT_FALSE(NewRoutingPolicy("fastest").ok());
}

std::vector<Hash128> Chain(uint64_t seed, int n) {
  std::mt19937_64 g(seed);
  std::vector<Hash128> out;
  for (int i = 0; i < n; ++i) out.push_back(Hash128{g(), g()});
  return out;
}

// Aggregated workers a, b, ... on slots 0, 1, ..., equally fast and idle.
std::vector<WorkerLoadView> Fleet(KvIndex* index, int n, double speed = 1000) {
  std::vector<WorkerLoadView> out;
  for (int i = 0; i < n; ++i) {
    WorkerLoadView w;
    w.id = std::string(1, static_cast<char>('a' + i));
    w.slot = index->AddWorker();
    w.prefill_tokens_per_second = speed;
    w.total_kv_blocks = 1000;
    w.free_kv_blocks = 1000;
    out.push_back(w);
  }
  return out;
}

constexpr int64_t kBlock = 16;

RouteRequest Prompt(const std::vector<Hash128>& chain, int64_t tokens) {
  RouteRequest r;
  r.prompt_tokens = tokens;
  r.block_hashes = chain;
  r.block_tokens = kBlock;
  return r;
}

TEST(PrefixAwareTest, AConversationReturnsToItsWorkerUnlessItIsBusy) {
  KvIndex index;
  auto workers = Fleet(&index, 3);
  PrefixAwarePolicy policy(&index, {}, 1);
  const auto chain = Chain(5, 12);  // a 12-block conversation so far, on worker b
  index.Stored(1, absl::MakeConstSpan(chain).subspan(0, 10));
  for (int turn = 0; turn < 20; ++turn) {
    const RouteChoice c = policy.Choose(workers, Prompt(chain, 12 * kBlock + 5));
    ASSERT_EQ(c.index, 1u);
    EXPECT_STREQ(c.reason, "prefix_hit");
    EXPECT_EQ(c.predicted_local_tokens, 10 * kBlock);
  }
  // Some queue on b: still b while the hit outweighs it.
  workers[1].queued_tokens = 100;
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 12 * kBlock + 5)).index, 1u);
  // The router's own unreported load counts as well.
  workers[1].queued_tokens = 0;
  workers[1].pending_prefill_tokens = 400;
  EXPECT_NE(policy.Choose(workers, Prompt(chain, 12 * kBlock + 5)).index, 1u);
  // Over the busy threshold (4 s of queued work) b gets nothing, whatever it holds...
  workers[1].pending_prefill_tokens = 0;
  const auto long_chain = Chain(6, 400);
  index.Stored(1, long_chain);
  workers[1].queued_tokens = 4100;  // 4.1 s at 1000 tokens/s
  const RouteChoice busy = policy.Choose(workers, Prompt(long_chain, 400 * kBlock + 1));
  EXPECT_NE(busy.index, 1u);
  EXPECT_STREQ(busy.reason, "least_cost");
  // ... unless every worker is busy.
  workers[0].queued_tokens = workers[2].queued_tokens = 5000;
  const RouteChoice all = policy.Choose(workers, Prompt(long_chain, 400 * kBlock + 1));
  EXPECT_EQ(all.index, 1u);
  EXPECT_STREQ(all.reason, "all_busy");
}

TEST(PrefixAwareTest, AWorkerOfHalfTheSpeedGetsHalfTheWork) {
  KvIndex index;
  auto workers = Fleet(&index, 2);
  workers[0].prefill_tokens_per_second = 2000;
  workers[1].prefill_tokens_per_second = 1000;
  PrefixAwarePolicy policy(&index, {}, 2);
  // Requests of 300..700 tokens arrive 10% faster than both can compute; each worker computes
  // its queue at its speed; the workers report their queues every 8 decisions (the router's
  // own count of what it sent covers the rest).
  std::mt19937_64 rng(11);
  double queue[2] = {0, 0};
  int picks[2] = {0, 0};
  const double dt = 500.0 / (3000 * 1.1);
  std::vector<double> reported = {0, 0};
  std::vector<double> sent = {0, 0};  // since the last report
  for (int i = 0; i < 1000; ++i) {
    const int64_t tokens = 300 + static_cast<int64_t>(rng() % 401);
    for (int w = 0; w < 2; ++w) {
      queue[w] = std::max(0.0, queue[w] - workers[w].prefill_tokens_per_second * dt);
      if (i % 8 == 0) {
        reported[w] = queue[w];
        sent[w] = 0;
      }
      workers[w].queued_tokens = static_cast<int64_t>(reported[w]);
      workers[w].pending_prefill_tokens = static_cast<int64_t>(reported[w] + sent[w]);
    }
    const RouteChoice c = policy.Choose(workers, Prompt({}, tokens));
    ++picks[c.index];
    queue[c.index] += static_cast<double>(tokens);
    sent[c.index] += static_cast<double>(tokens);
  }
  const double ratio = static_cast<double>(picks[1]) / picks[0];
  EXPECT_GE(ratio, 0.4) << picks[0] << " vs " << picks[1];
  EXPECT_LE(ratio, 0.6) << picks[0] << " vs " << picks[1];
  // With no speed measured, costs are in tokens and no queue is called busy: a holder with a
  // queue keeps its conversation while the hit outweighs the queue.
  {
    KvIndex fresh;
    auto idle = Fleet(&fresh, 2, /*speed=*/0);
    const auto chain = Chain(77, 4);
    fresh.Stored(0, chain);
    idle[0].queued_tokens = 40;
    PrefixAwarePolicy cold(&fresh, {}, 9);
    EXPECT_EQ(cold.Choose(idle, Prompt(chain, 4 * kBlock + 1)).index, 0u);
  }
  // Unmeasured workers take the median speed: equal, so ties, broken at random.
  workers[0].prefill_tokens_per_second = workers[1].prefill_tokens_per_second = 0;
  workers[0].queued_tokens = workers[1].queued_tokens = 0;
  workers[0].pending_prefill_tokens = workers[1].pending_prefill_tokens = 0;
  int tie[2] = {0, 0};
  for (int i = 0; i < 200; ++i) ++tie[policy.Choose(workers, Prompt({}, 100)).index];
  EXPECT_GT(tie[0], 60);
  EXPECT_GT(tie[1], 60);
}

TEST(PrefixAwareTest, EvictionsMoveTrafficAway) {
  KvIndex index;
  auto workers = Fleet(&index, 2);
  PrefixAwarePolicy policy(&index, {}, 3);
  const auto chain = Chain(9, 8);
  index.Stored(0, chain);
  index.Stored(1, absl::MakeConstSpan(chain).subspan(0, 4));
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 8 * kBlock + 3)).index, 0u);
  index.Evicted(0, {chain[2]});  // worker a now holds 2 blocks of the prefix, b 4
  const RouteChoice c = policy.Choose(workers, Prompt(chain, 8 * kBlock + 3));
  EXPECT_EQ(c.index, 1u);
  EXPECT_EQ(c.predicted_local_tokens, 4 * kBlock);
  index.Cleared(1);  // a restart
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 8 * kBlock + 3)).index, 0u);
}

TEST(PrefixAwareTest, PredictsWhatTheEngineReuses) {
  KvIndex index;
  auto workers = Fleet(&index, 1);
  PrefixAwarePolicy policy(&index, {}, 4);
  const auto chain = Chain(21, 4);
  index.Stored(0, chain);
  // A block-aligned prompt: its last block is computed again (its last token needs logits).
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 4 * kBlock)).predicted_local_tokens, 3 * kBlock);
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 4 * kBlock + 1)).predicted_local_tokens,
            4 * kBlock);
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 1)).predicted_local_tokens, 0);
  // Blocks only the store holds: read from it, not counted as the worker's memory.
  RouteRequest r = Prompt(chain, 4 * kBlock + 1);
  index.Evicted(0, {chain[2]});
  r.store_prefix_blocks = 4;
  const RouteChoice c = policy.Choose(workers, r);
  EXPECT_EQ(c.predicted_local_tokens, 2 * kBlock);
  EXPECT_EQ(c.predicted_store_tokens, 2 * kBlock);
  EXPECT_STREQ(c.reason, "prefix_hit");
  // A hybrid model: the prefix counts only as far as the window cache holds the blocks the next
  // position sees (window 32 tokens: the last two blocks before it).
  index.Stored(0, {chain[2]});
  workers[0].max_window = 2 * kBlock;
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 4 * kBlock + 1)).predicted_local_tokens, 0);
  index.Stored(0, {chain[1], chain[2]}, /*window=*/true);
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 4 * kBlock + 1)).predicted_local_tokens,
            3 * kBlock);
  index.Stored(0, {chain[3]}, /*window=*/true);
  EXPECT_EQ(policy.Choose(workers, Prompt(chain, 4 * kBlock + 1)).predicted_local_tokens,
            4 * kBlock);
}

TEST(PrefixAwareTest, StoreHitsCostTheirFetchAndDecodeWorkersTheirLoad) {
  KvIndex index;
  auto workers = Fleet(&index, 2);
  PrefixAwarePolicy policy(&index, {}, 5);
  const auto chain = Chain(33, 10);
  index.Stored(0, chain);
  // The store holds the whole prefix: b reads it (a fetch cost) and a holds it: a wins, but a
  // queue on a of more than the fetch cost sends it to b.
  RouteRequest r = Prompt(chain, 10 * kBlock + 1);
  r.store_prefix_blocks = 10;
  EXPECT_EQ(policy.Choose(workers, r).index, 0u);
  workers[0].queued_tokens = 20;  // 20 ms at 1000 tokens/s > 10 blocks x 0.5 ms
  const RouteChoice c = policy.Choose(workers, r);
  EXPECT_EQ(c.index, 1u);
  EXPECT_STREQ(c.reason, "store_hit");
  EXPECT_EQ(c.predicted_store_tokens, 10 * kBlock);

  // Decode workers: the faster step and the lighter load win; one without room for the prompt
  // is busy.
  std::vector<WorkerLoadView> decode = Fleet(&index, 2);
  for (auto& d : decode) {
    d.kind = WorkerKind::kDecode;
    d.total_kv_blocks = 100;
    d.free_kv_blocks = 100;
  }
  decode[0].step_time_ms = 20;
  decode[1].step_time_ms = 10;
  EXPECT_EQ(policy.Choose(decode, Prompt({}, 100)).index, 1u);
  decode[1].running_tokens = 100 * kBlock;  // full: twice the cost of an idle step
  decode[1].free_kv_blocks = 0;
  EXPECT_EQ(policy.Choose(decode, Prompt({}, 100)).index, 0u);
  decode[1].free_kv_blocks = 50;
  decode[1].running_tokens = 50 * kBlock;
  EXPECT_EQ(policy.Choose(decode, Prompt({}, 100)).index, 1u);
  EXPECT_EQ(policy.Choose(decode, Prompt({}, 100)).predicted_local_tokens, 0);
  EXPECT_TRUE(NewRoutingPolicy("prefix_aware", 1, &index).ok());
  EXPECT_FALSE(NewRoutingPolicy("prefix_aware", 1, nullptr).ok());
}

}  // namespace
}  // namespace ferry
