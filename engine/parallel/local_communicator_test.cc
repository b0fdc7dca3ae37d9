// The in-process communicator (local_communicator.h): all-reduce in rank order (the same bits on
// every rank, the order visible in fp32 rounding), all-gather, strided views and bf16, repeated
// collectives on one group, and a rank that never arrives failing the others within the timeout.

#include "engine/parallel/local_communicator.h"

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

// Runs fn(rank) on one thread per communicator.
template <typename Fn>
void OnEveryRank(std::vector<std::unique_ptr<Communicator>>& comms, Fn fn) {
  std::vector<std::thread> threads;
  for (auto& c : comms) threads.emplace_back([&c, &fn] { fn(*c); });
  for (auto& t : threads) t.join();
}

TEST(LocalCommunicatorTest, AllReduceSumsInRankOrderOnEveryRank) {
  auto comms = LocalCommunicatorGroup::Create(3);
  // In rank order (1 + 1e8) + -1e8 = 0 in fp32 (1 + 1e8 rounds to 1e8); in the reverse order
  // (-1e8 + 1e8) + 1 = 1: the order shows in the result.
  const float values[3] = {1.0f, 1e8f, -1e8f};
  std::vector<std::vector<float>> data(3, std::vector<float>(6));
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) data[r][i] = i == 0 ? values[r] : static_cast<float>(r * 10 + i);
  }
  for (int round = 0; round < 3; ++round) {  // the group serves one collective after another
    std::vector<std::vector<float>> x = data;
    OnEveryRank(comms, [&](Communicator& c) {
      const DeviceMatrix m = DeviceMatrix::Dense(x[c.rank()].data(), DType::kF32, 2, 3);
      ASSERT_TRUE(c.AllReduceSum(m).ok());
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(x[r][0], 0.0f);
      EXPECT_NE(x[r][0], (-1e8f + 1e8f) + 1.0f);
      for (int i = 1; i < 6; ++i) EXPECT_EQ(x[r][i], static_cast<float>(0 + 10 + 20 + 3 * i));
    }
  }
}

TEST(LocalCommunicatorTest, AllGatherPutsRanksSideBySide) {
  auto comms = LocalCommunicatorGroup::Create(2);
  std::vector<std::vector<float>> x = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  std::vector<std::vector<float>> out(2, std::vector<float>(8));
  OnEveryRank(comms, [&](Communicator& c) {
    const DeviceMatrix in = DeviceMatrix::Dense(x[c.rank()].data(), DType::kF32, 2, 2);
    const DeviceMatrix o = DeviceMatrix::Dense(out[c.rank()].data(), DType::kF32, 2, 4);
    ASSERT_TRUE(c.AllGather(in, o).ok());
  });
  const std::vector<float> want = {1, 2, 5, 6, 3, 4, 7, 8};
  EXPECT_EQ(out[0], want);
  EXPECT_EQ(out[1], want);
}

TEST(LocalCommunicatorTest, Bf16AndStridedViews) {
  auto comms = LocalCommunicatorGroup::Create(2);
  // bf16 1.5 and 2.25 in columns 1..2 of 4-wide rows; columns 0 and 3 must stay untouched.
  std::vector<std::vector<uint16_t>> x = {{7, 0x3fc0, 0x3fc0, 9}, {7, 0x4010, 0x4010, 9}};
  OnEveryRank(comms, [&](Communicator& c) {
    DeviceMatrix m{x[c.rank()].data() + 1, DType::kBF16, 1, 2, 4};
    ASSERT_TRUE(c.AllReduceSum(m).ok());
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(x[r][0], 7);
    EXPECT_EQ(x[r][1], 0x4070);  // 3.75
    EXPECT_EQ(x[r][2], 0x4070);
    EXPECT_EQ(x[r][3], 9);
  }
}

TEST(LocalCommunicatorTest, AMissingRankFailsTheOthersInTime) {
  auto comms = LocalCommunicatorGroup::Create(2, absl::Milliseconds(200));
  std::vector<float> x(4, 1.0f);
  const absl::Status s = comms[0]->AllReduceSum(DeviceMatrix::Dense(x.data(), DType::kF32, 1, 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  // The group is broken: the late rank fails at once instead of waiting for a partner.
  EXPECT_FALSE(comms[1]->AllReduceSum(DeviceMatrix::Dense(x.data(), DType::kF32, 1, 4)).ok());
}

}  // namespace
}  // namespace ferry
