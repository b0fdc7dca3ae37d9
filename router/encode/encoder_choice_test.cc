#include "router/encode/encoder_choice.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

Hash128 Image(int i) { return Xxh3Hash128(absl::StrCat("image-", i)); }

std::vector<EncoderLoadView> Pool(int n) {
  std::vector<EncoderLoadView> pool;
  for (int i = 0; i < n; ++i) pool.push_back({absl::StrCat("10.0.0.", i, ":7000"), true, 0});
  return pool;
}

TEST(EncoderChoiceTest, NoneUpNoneTried) {
  std::vector<EncoderLoadView> pool = Pool(3);
  for (EncoderLoadView& e : pool) e.up = false;
  EXPECT_TRUE(EncoderOrder(Image(1), pool).empty());
  EXPECT_TRUE(EncoderOrder(Image(1), {}).empty());
}

TEST(EncoderChoiceTest, SameImageSameEncoderAndEveryUpEncoderTried) {
  const std::vector<EncoderLoadView> pool = Pool(4);
  for (int i = 0; i < 50; ++i) {
    const std::vector<size_t> a = EncoderOrder(Image(i), pool);
    EXPECT_EQ(a, EncoderOrder(Image(i), pool));
    ASSERT_EQ(a.size(), 4u);
    std::vector<size_t> sorted = a;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<size_t>{0, 1, 2, 3}));
  }
}

TEST(EncoderChoiceTest, ImagesSpreadOverTheEncoders) {
  const std::vector<EncoderLoadView> pool = Pool(4);
  std::map<size_t, int> first;
  for (int i = 0; i < 400; ++i) ++first[EncoderOrder(Image(i), pool)[0]];
  ASSERT_EQ(first.size(), 4u);
  for (const auto& [index, count] : first) EXPECT_GT(count, 50) << index;
}

TEST(EncoderChoiceTest, ADownEncoderMovesOnlyItsOwnImages) {
  std::vector<EncoderLoadView> pool = Pool(4);
  std::vector<size_t> before;
  for (int i = 0; i < 200; ++i) before.push_back(EncoderOrder(Image(i), pool)[0]);
  pool[2].up = false;
  for (int i = 0; i < 200; ++i) {
    const std::vector<size_t> now = EncoderOrder(Image(i), pool);
    ASSERT_EQ(now.size(), 3u);
    for (size_t k : now) EXPECT_NE(k, 2u);
    if (before[i] != 2) {
      EXPECT_EQ(now[0], before[i]) << i;
    } else {
      // Its images go to their second choice of before.
      std::vector<EncoderLoadView> all = Pool(4);
      EXPECT_EQ(now[0], EncoderOrder(Image(i), all)[1]) << i;
    }
  }
}

TEST(EncoderChoiceTest, AMuchLongerQueueGoesLast) {
  std::vector<EncoderLoadView> pool = Pool(3);
  const Hash128 image = Image(7);
  const size_t preferred = EncoderOrder(image, pool)[0];
  // Within the slack: still first.
  pool[preferred].backlog = kEncoderBacklogSlack;
  EXPECT_EQ(EncoderOrder(image, pool)[0], preferred);
  // Beyond it: last, but still tried.
  pool[preferred].backlog = kEncoderBacklogSlack + 1;
  std::vector<size_t> order = EncoderOrder(image, pool);
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[2], preferred);
  // Every queue long: twice the shortest (plus the slack) is the bar.
  for (EncoderLoadView& e : pool) e.backlog = 100;
  pool[preferred].backlog = 200;
  EXPECT_EQ(EncoderOrder(image, pool)[0], preferred);
  pool[preferred].backlog = 201;
  EXPECT_EQ(EncoderOrder(image, pool)[2], preferred);
}

}  // namespace
}  // namespace ferry
