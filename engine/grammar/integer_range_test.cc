#include "engine/grammar/integer_range.h"

#include <gtest/gtest.h>

namespace ferry::grammar {
namespace {

TEST(IntegerRangeTest, SmallRanges) {
  EXPECT_EQ(IntegerRangeGbnf(0, 9), "([0-9])");
  EXPECT_EQ(IntegerRangeGbnf(5, 5), "(\"5\")");
  EXPECT_EQ(IntegerRangeGbnf(1, 100), "([1-9] | [1-9] [0-9] | \"1\" \"0\" \"0\")");
  EXPECT_EQ(IntegerRangeGbnf(-3, -1), "(\"-\" ([1-3]))");
  EXPECT_EQ(IntegerRangeGbnf(0, std::nullopt), "([0-9] | [1-9] [0-9]{1,})");
}

}  // namespace
}  // namespace ferry::grammar
