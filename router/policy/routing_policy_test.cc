// Routing policies: round_robin spreads evenly; least_loaded follows the router's in-flight
// counts, then the reported tokens, and breaks ties at random (both tied workers get picked).

#include "router/policy/routing_policy.h"

#include <map>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace ferry
