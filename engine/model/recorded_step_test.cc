#include "engine/model/recorded_step.h"

#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(RecordedStepTest, RowsComeInCaptureSizes) {
  const std::vector<std::pair<int64_t, int64_t>> cases = {
      {1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8}, {8, 8}, {9, 16}, {16, 16}, {17, 24}, {250, 256}};
  for (const auto& [rows, padded] : cases) EXPECT_EQ(RecordedRows(rows, 256), padded) << rows;
  EXPECT_EQ(RecordedRows(0, 256), 0);
  EXPECT_EQ(RecordedRows(251, 252), 0);  // 256 rows would exceed the backend's most
  EXPECT_EQ(RecordedRows(3, 3), 0);
}

TEST(RecordedStepTest, TablesComeInPowersOfTwo) {
  EXPECT_EQ(TableCapacity(0), 1);
  EXPECT_EQ(TableCapacity(1), 1);
  EXPECT_EQ(TableCapacity(3), 4);
  EXPECT_EQ(TableCapacity(64), 64);
  EXPECT_EQ(TableCapacity(65), 128);
}

StepLayout Decode(std::vector<int32_t> positions, std::vector<std::vector<int32_t>> tables) {
  StepLayout l;
  l.positions = std::move(positions);
  for (size_t r = 0; r < l.positions.size(); ++r) l.row_sequence.push_back(static_cast<int32_t>(r));
  l.block_tables = std::move(tables);
  return l;
}

TEST(RecordedStepTest, PaddingRowsWriteNothingAndReadAValidBlock) {
  std::vector<int32_t> ids = {11, 12, 13};
  StepLayout full = Decode({5, 0, 9}, {{7, 8}, {3}, {4, 6, 2}});
  StepLayout window = Decode({5, 0, 9}, {{-1, 20}, {21}, {-1, -1, 22}});
  ASSERT_TRUE(PadDecodeStep(4, 4, 4, &ids, &full, &window));
  EXPECT_EQ(ids, (std::vector<int32_t>{11, 12, 13, 0}));
  EXPECT_EQ(full.positions, (std::vector<int32_t>{5, 0, 9, 0}));
  EXPECT_EQ(full.row_sequence, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(full.no_write, (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(full.block_tables, (std::vector<std::vector<int32_t>>{
                                   {7, 8, 8, 8}, {3, 3, 3, 3}, {4, 6, 2, 2}, {8, 8, 8, 8}}));
  // The window pool's filler is a block the first sequence holds there, not a gone one (-1).
  EXPECT_EQ(window.block_tables[3], (std::vector<int32_t>(4, 20)));
  EXPECT_EQ(window.block_tables[0], (std::vector<int32_t>{-1, 20, 20, 20}));
  EXPECT_EQ(window.no_write, full.no_write);
  EXPECT_TRUE(full.first_keys.empty());
}

TEST(RecordedStepTest, StepsOfOneShapeHaveTheSameSizes) {
  // What a recording is bound to: the vectors' lengths (the device layout's offsets).
  std::vector<int32_t> a_ids = {1, 2, 3}, b_ids = {4, 5, 6, 7, 8};
  StepLayout a = Decode({1, 2, 3}, {{1}, {2}, {3}});
  StepLayout b = Decode({30, 2, 3, 70, 6}, {{1, 2}, {3}, {4}, {5, 6, 7, 9}, {8}});
  ASSERT_TRUE(PadDecodeStep(8, 4, 0, &a_ids, &a, nullptr));
  ASSERT_TRUE(PadDecodeStep(8, 4, 0, &b_ids, &b, nullptr));
  EXPECT_EQ(a_ids.size(), b_ids.size());
  EXPECT_EQ(a.rows(), b.rows());
  for (int64_t r = 0; r < a.rows(); ++r) {
    EXPECT_EQ(a.block_tables[r].size(), 4u);
    EXPECT_EQ(b.block_tables[r].size(), 4u);
  }
}

TEST(RecordedStepTest, NotADecodeStepIsLeftAlone) {
  std::vector<int32_t> ids = {1, 2};
  StepLayout chunk = Decode({0, 1}, {{5}, {5}});
  chunk.row_sequence = {0, 0};  // two rows of one sequence
  chunk.block_tables.pop_back();
  const StepLayout before = chunk;
  EXPECT_FALSE(PadDecodeStep(4, 1, 0, &ids, &chunk, nullptr));
  EXPECT_EQ(chunk.positions, before.positions);
  EXPECT_EQ(ids.size(), 2u);
  StepLayout long_table = Decode({0}, {{1, 2, 3}});
  std::vector<int32_t> one = {1};
  EXPECT_FALSE(PadDecodeStep(1, 2, 0, &one, &long_table, nullptr));  // over its capacity
  StepLayout floor = Decode({9}, {{1}});
  floor.first_keys = {4};
  EXPECT_FALSE(PadDecodeStep(1, 1, 0, &one, &floor, nullptr));
  StepLayout few = Decode({0, 0}, {{1}, {2}});
  std::vector<int32_t> two = {1, 2};
  EXPECT_FALSE(PadDecodeStep(1, 1, 0, &two, &few, nullptr));  // fewer rows than the step's
}

}  // namespace
}  // namespace ferry
