// FlattenStep (step_upload.h): the words the GPU's WriteKv and Attention read, laid out as the
// header says, with the defaults for empty first_keys and no_write, and inconsistent layouts
// refused.

#include "engine/backends/cuda/step_upload.h"

#include <vector>

#include "gtest/gtest.h"

namespace ferry::cuda {
namespace {

TEST(FlattenStepTest, LaysOutEveryPart) {
  // Two sequences: a 3-token prefill chunk at 5..7 and one decode row at 40.
  StepWords s;
  ASSERT_TRUE(
      FlattenStep({5, 6, 7, 40}, {0, 0, 0, 1}, {{9, 4}, {1, 2, 3}}, {0, 16}, {1, 0, 0, 0}, &s));
  const StepOffsets& o = s.offsets;
  EXPECT_EQ(o.rows, 4);
  EXPECT_EQ(o.sequences, 2);
  EXPECT_EQ(o.max_position, 40);
  const std::vector<int32_t> want = {5, 6,  7, 40,      // positions
                                     0, 0,  0, 1,       // row_sequence
                                     0, 1,  1, 1,       // writes
                                     0, 16,             // first_keys
                                     0, 2,  5,          // table_offsets
                                     9, 4,  1, 2,  3};  // tables
  EXPECT_EQ(s.words, want);
  EXPECT_EQ(o.words, static_cast<int32_t>(want.size()));
  EXPECT_EQ(s.words[o.positions + 3], 40);
  EXPECT_EQ(s.words[o.row_sequence + 3], 1);
  EXPECT_EQ(s.words[o.writes], 0);
  EXPECT_EQ(s.words[o.first_keys + 1], 16);
  // Sequence 1's block 2: the word at tables + table_offsets[1] + 2.
  EXPECT_EQ(s.words[o.tables + s.words[o.table_offsets + 1] + 2], 3);
}

TEST(FlattenStepTest, EmptyOptionalPartsMeanZeroAndWrite) {
  StepWords s;
  ASSERT_TRUE(FlattenStep({0, 1}, {0, 0}, {{7}}, {}, {}, &s));
  EXPECT_EQ(s.words[s.offsets.first_keys], 0);
  EXPECT_EQ(s.words[s.offsets.writes], 1);
  EXPECT_EQ(s.words[s.offsets.writes + 1], 1);
}

TEST(FlattenStepTest, RefusesInconsistentLayouts) {
  StepWords s;
  EXPECT_FALSE(FlattenStep({0, 1}, {0}, {{7}}, {}, {}, &s));  // row_sequence short
  EXPECT_FALSE(FlattenStep({0}, {1}, {{7}}, {}, {}, &s));     // sequence out of range
  EXPECT_FALSE(FlattenStep({0}, {-1}, {{7}}, {}, {}, &s));
  EXPECT_FALSE(FlattenStep({0}, {0}, {{7}}, {0, 0}, {}, &s));  // first_keys per sequence
  EXPECT_FALSE(FlattenStep({0}, {0}, {{7}}, {}, {0, 1}, &s));  // no_write per row
}

TEST(FlattenStepTest, AnEmptyStepHasOnlyTheTableOffset) {
  StepWords s;
  ASSERT_TRUE(FlattenStep({}, {}, {}, {}, {}, &s));
  EXPECT_EQ(s.offsets.words, 1);
  EXPECT_EQ(s.offsets.max_position, -1);
}

}  // namespace
}  // namespace ferry::cuda
