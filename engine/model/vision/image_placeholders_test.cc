#include "engine/model/vision/image_placeholders.h"

#include <limits>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(ImagePlaceholders, ExpandsEachImageTokenInOrder) {
  const std::vector<TokenId> prompt = {1, 9, 2, 9, 9, 3};
  auto e = ExpandImagePlaceholders(prompt, 9, 3, 3, 100);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->tokens, (std::vector<TokenId>{1, 9, 9, 9, 2, 9, 9, 9, 9, 9, 9, 3}));
  ASSERT_EQ(e->images.size(), 3u);
  EXPECT_EQ(e->images[0].start, 1);
  EXPECT_EQ(e->images[1].start, 5);
  EXPECT_EQ(e->images[2].start, 8);
  for (const auto& s : e->images) EXPECT_EQ(s.length, 3);
}

TEST(ImagePlaceholders, NoImages) {
  auto e = ExpandImagePlaceholders({4, 5}, 9, 16, 0, 100);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->tokens, (std::vector<TokenId>{4, 5}));
  EXPECT_TRUE(e->images.empty());
}

TEST(ImagePlaceholders, RefusesACountMismatch) {
  auto e = ExpandImagePlaceholders({9, 1}, 9, 4, 2, 100);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("1 image token (id 9) for 2 images"), std::string::npos)
      << e.status();
  EXPECT_FALSE(ExpandImagePlaceholders({1, 2}, 9, 4, 1, 100).ok());
}

TEST(ImagePlaceholders, RefusesAnOverlongPrompt) {
  auto e = ExpandImagePlaceholders({9, 9}, 9, 10, 2, 19);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("over 19 tokens (2 tokens, 10 per image)"), std::string::npos)
      << e.status();
  EXPECT_TRUE(ExpandImagePlaceholders({9, 9}, 9, 10, 2, 20).ok());
  EXPECT_FALSE(ExpandImagePlaceholders({9}, 9, 0, 1, 19).ok());
  // A huge count is refused, not overflowed.
  EXPECT_FALSE(
      ExpandImagePlaceholders({9, 9}, 9, std::numeric_limits<int64_t>::max() / 2, 2, 100).ok());
}

}  // namespace
}  // namespace ferry
