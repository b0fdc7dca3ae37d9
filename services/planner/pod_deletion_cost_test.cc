#include "services/planner/pod_deletion_cost.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;

WorkerSample Worker(const std::string& id, int64_t inflight, int64_t running, int64_t queued,
                    int64_t tokens) {
  WorkerSample w;
  w.id = id;
  w.ready = true;
  w.inflight = inflight;
  w.running_requests = running;
  w.queued_requests = queued;
  w.running_tokens = tokens;
  return w;
}

TEST(WorkerPodIp, IsTheHostOfTheAddress) {
  EXPECT_EQ(WorkerPodIp("10.1.2.3:50051"), "10.1.2.3");
  EXPECT_EQ(WorkerPodIp("[fd00::7]:50051"), "fd00::7");
  EXPECT_EQ(WorkerPodIp("10.1.2.3"), "10.1.2.3");
}

TEST(PodDeletionCosts, LeastLoadedLowest) {
  const std::vector<WorkerSample> workers = {
      Worker("10.0.0.1:50051", 5, 5, 0, 900),  // busiest
      Worker("10.0.0.2:50051", 1, 1, 0, 100),  // least loaded
      Worker("10.0.0.3:50051", 0, 2, 1, 300),  // 3 held by the worker's count
  };
  EXPECT_THAT(PodDeletionCosts({"10.0.0.1", "10.0.0.2", "10.0.0.3"}, workers),
              ElementsAre(3, 1, 2));
}

TEST(PodDeletionCosts, EqualLoadsEqualCostsTokensBreakTies) {
  const std::vector<WorkerSample> workers = {
      Worker("10.0.0.1:1", 2, 2, 0, 500),
      Worker("10.0.0.2:1", 2, 2, 0, 100),
      Worker("10.0.0.3:1", 2, 2, 0, 500),
  };
  EXPECT_THAT(PodDeletionCosts({"10.0.0.1", "10.0.0.2", "10.0.0.3"}, workers),
              ElementsAre(2, 1, 2));
}

TEST(PodDeletionCosts, UnknownDrainingAndNotReadyGoFirst) {
  WorkerSample draining = Worker("10.0.0.2:1", 9, 9, 0, 9000);
  draining.draining = true;
  WorkerSample starting = Worker("10.0.0.3:1", 0, 0, 0, 0);
  starting.ready = false;
  const std::vector<WorkerSample> workers = {Worker("10.0.0.1:1", 0, 0, 0, 0), draining, starting,
                                             Worker("[fd00::9]:1", 4, 4, 0, 10)};
  EXPECT_THAT(
      PodDeletionCosts({"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "", "fd00::9"}, workers),
      ElementsAre(1, 0, 0, 0, 0, 2));
}

TEST(PodDeletionCosts, NoPodsNoWorkers) {
  EXPECT_TRUE(PodDeletionCosts({}, {Worker("10.0.0.1:1", 1, 1, 0, 1)}).empty());
  EXPECT_THAT(PodDeletionCosts({"10.0.0.1"}, {}), ElementsAre(0));
}

}  // namespace
}  // namespace ferry
