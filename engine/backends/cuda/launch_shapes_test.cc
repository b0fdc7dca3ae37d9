// The CUDA backend's launch arithmetic (launch_shapes.h), on the host: the keys a row sees (causal,
// sliding window, first key), the tiles they touch (aligned to absolute positions, so the same
// for a row alone or in any batch), and grid sizes.

#include "engine/backends/cuda/launch_shapes.h"

#include "gtest/gtest.h"

namespace ferry::cuda {
namespace {

TEST(LaunchShapesTest, VisibleKeys) {
  const KeyRange causal = VisibleKeys(9, 0, 0);
  EXPECT_EQ(causal.first, 0);
  EXPECT_EQ(causal.last, 9);
  const KeyRange windowed = VisibleKeys(9, 0, 4);  // keys 6..9
  EXPECT_EQ(windowed.first, 6);
  EXPECT_EQ(VisibleKeys(2, 0, 4).first, 0);  // the window reaches past the start
  EXPECT_EQ(VisibleKeys(9, 8, 4).first, 8);  // the first key cuts further
  EXPECT_EQ(VisibleKeys(9, 3, 0).first, 3);
}

TEST(LaunchShapesTest, TilesAreAlignedToPositions) {
  const int t = kAttentionTile;
  EXPECT_EQ(FirstTile(VisibleKeys(0, 0, 0)), 0);
  EXPECT_EQ(LastTile(VisibleKeys(0, 0, 0)), 0);
  EXPECT_EQ(LastTile(VisibleKeys(t - 1, 0, 0)), 0);
  EXPECT_EQ(LastTile(VisibleKeys(t, 0, 0)), 1);
  // A window starting mid-tile: the tiles it overlaps, the same wherever the row is computed.
  const KeyRange r = VisibleKeys(3 * t + 5, 0, t);
  EXPECT_EQ(FirstTile(r), 2);
  EXPECT_EQ(LastTile(r), 3);
  // No keys at all (a first key past the position): no tiles.
  const KeyRange none = VisibleKeys(4, 9, 0);
  EXPECT_LT(LastTile(none), FirstTile(none));
}

TEST(LaunchShapesTest, GridSizes) {
  EXPECT_EQ(CeilDiv(0, 4), 0);
  EXPECT_EQ(CeilDiv(9, 4), 3);
  EXPECT_EQ(ElementwiseBlocks(1), 1);
  EXPECT_EQ(ElementwiseBlocks(kElementThreads + 1), 2);
  EXPECT_EQ(ElementwiseBlocks(int64_t{1} << 40), 65535);  // capped; kernels loop
  const GemvGrid g = QuantGemvGrid(17, 4097);
  EXPECT_EQ(g.x, CeilDiv(4097, kGemvWarps));
  EXPECT_EQ(g.y, CeilDiv(17, kGemvRows));
}

}  // namespace
}  // namespace ferry::cuda
