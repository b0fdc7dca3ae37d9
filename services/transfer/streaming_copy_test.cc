#include "services/transfer/streaming_copy.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace transfer {
namespace {

// Every byte of the destination range equals the source's, and no byte around it was touched,
// for every alignment of either side and lengths on both sides of the streamed minimum and of
// the 64-byte loop.
TEST(StreamingCopyTest, CopiesExactlyTheRangeAtEveryAlignment) {
  std::mt19937 rng(7);
  std::vector<unsigned char> src(20000), dst(20000);
  for (auto& b : src) b = static_cast<unsigned char>(rng());
  const size_t lengths[] = {0, 1, 15, 16, 63, 64, 65, 4095, 4096, 4097, 4160, 12345, 16384};
  for (size_t length : lengths) {
    for (size_t src_offset = 0; src_offset < 17; ++src_offset) {
      for (size_t dst_offset = 0; dst_offset < 17; ++dst_offset) {
        std::fill(dst.begin(), dst.end(), 0xA5);
        StreamingCopy(dst.data() + 64 + dst_offset, src.data() + src_offset, length);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 64 + dst_offset && i < 64 + dst_offset + length;
          const unsigned char want = inside ? src[i - 64 - dst_offset + src_offset] : 0xA5;
          ASSERT_EQ(dst[i], want) << "length " << length << " src+" << src_offset << " dst+"
                                  << dst_offset << " byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace transfer
}  // namespace ferry
