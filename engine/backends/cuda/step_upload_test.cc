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

TEST(PackStepInputsTest, OneArrayAtOffsetsThatFollowTheShapeOnly) {
  // Two decode steps of one recorded shape (2 rows, tables of 2 blocks), different contents.
  StepWords a_full, a_window, b_full, b_window;
  ASSERT_TRUE(FlattenStep({3, 17}, {0, 1}, {{1, 2}, {3, 3}}, {}, {0, 1}, &a_full));
  ASSERT_TRUE(FlattenStep({3, 17}, {0, 1}, {{5, 6}, {7, 7}}, {}, {0, 1}, &a_window));
  ASSERT_TRUE(FlattenStep({30, 1}, {0, 1}, {{8, 9}, {4, 4}}, {}, {0, 1}, &b_full));
  ASSERT_TRUE(FlattenStep({30, 1}, {0, 1}, {{2, 1}, {6, 6}}, {}, {0, 1}, &b_window));
  StepInputWords a, b;
  ASSERT_TRUE(PackStepInputs({11, 12}, {3, 17}, {&a_full, &a_window}, 31, &a));
  ASSERT_TRUE(PackStepInputs({13, 14}, {30, 1}, {&b_full, &b_window}, 31, &b));
  EXPECT_EQ(a.ids, 0);
  EXPECT_EQ(a.positions, 2);
  EXPECT_EQ(a.layouts[0], 4);
  EXPECT_EQ(a.layouts[1], 4 + a_full.offsets.words);
  EXPECT_EQ(a.words.size(), b.words.size());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(a.layouts[i], b.layouts[i]);
    EXPECT_EQ(a.offsets[i].words, b.offsets[i].words);
    EXPECT_EQ(a.offsets[i].tables, b.offsets[i].tables);
    EXPECT_EQ(a.offsets[i].max_position, 31);  // the bound, not the step's 17 or 30
    EXPECT_EQ(b.offsets[i].max_position, 31);
  }
  EXPECT_EQ(std::vector<int32_t>(a.words.begin(), a.words.begin() + 4),
            (std::vector<int32_t>{11, 12, 3, 17}));
  EXPECT_EQ(std::vector<int32_t>(b.words.begin() + b.layouts[1], b.words.end()), b_window.words);
}

TEST(PackStepInputsTest, RefusesDisagreeingParts) {
  StepWords one_row;
  ASSERT_TRUE(FlattenStep({3}, {0}, {{1}}, {}, {}, &one_row));
  StepInputWords out;
  EXPECT_FALSE(PackStepInputs({1, 2}, {3, 4}, {&one_row}, 15, &out));  // 2 rows, a 1-row layout
  EXPECT_FALSE(PackStepInputs({1}, {3, 4}, {&one_row}, 15, &out));     // ids and positions
  EXPECT_FALSE(PackStepInputs({1}, {3}, {}, 15, &out));                // no layout
  EXPECT_FALSE(PackStepInputs({1}, {3}, {&one_row, &one_row, &one_row}, 15, &out));
  EXPECT_FALSE(PackStepInputs({1}, {3}, {&one_row}, 2, &out));  // a position past the bound
  EXPECT_TRUE(PackStepInputs({1}, {3}, {&one_row}, 3, &out));
}

}  // namespace
}  // namespace ferry::cuda
