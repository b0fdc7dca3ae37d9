#include "engine/model/dequantize.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(DequantizeTest, HalfToFloatIsExact) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(Bits(HalfToFloat(0x8000)), 0x80000000u);         // -0
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
}

TEST(DequantizeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(FromBits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(FromBits(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToBf16(FromBits(0x7f7fffff)), 0x7f80);  // rounds to infinity
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
  const uint16_t nan = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(FromBits(0x7f800001)))));  // signalling stays NaN
}

TEST(DequantizeTest, QuantizedBlocks) {
  // Q4_1: d = 0.5 (0x3800), m = -1 (0xbc00), nibbles 0..15 low, 15..0 high.
  std::vector<uint8_t> q41 = {0x00, 0x38, 0x00, 0xbc};
  for (int j = 0; j < 16; ++j) q41.push_back(static_cast<uint8_t>(j | ((15 - j) << 4)));
  float out[32];
  ASSERT_TRUE(DequantizeToF32(3, q41.data(), q41.size(), 32, out).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * j - 1.0f);
    EXPECT_EQ(out[j + 16], 0.5f * (15 - j) - 1.0f);
  }
  // Q4_0: d = 2, nibble - 8.
  std::vector<uint8_t> q40 = {0x00, 0x40};
  for (int j = 0; j < 16; ++j) q40.push_back(static_cast<uint8_t>(j | (j << 4)));
  ASSERT_TRUE(DequantizeToF32(2, q40.data(), q40.size(), 32, out).ok());
  for (int j = 0; j < 16; ++j) EXPECT_EQ(out[j], 2.0f * (j - 8));
  // Q8_0: d = 0.25, q = -16..15.
  std::vector<uint8_t> q80 = {0x00, 0x34};
  for (int j = 0; j < 32; ++j) q80.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  ASSERT_TRUE(DequantizeToF32(8, q80.data(), q80.size(), 32, out).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 0.25f * (j - 16));
  uint16_t bf[32];
  ASSERT_TRUE(DequantizeToBf16(8, q80.data(), q80.size(), 32, bf).ok());
  for (int j = 0; j < 32; ++j) EXPECT_EQ(Bf16ToFloat(bf[j]), 0.25f * (j - 16));
}

TEST(DequantizeTest, ParallelRangesEqualOneSequentialPass) {
  std::mt19937 rng(5);
  const size_t blocks = 40000;  // > 1M elements: many ranges on the pool
  std::vector<uint8_t> data(blocks * 20);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < blocks; ++b) {  // finite scales
    data[b * 20 + 1] &= 0x3b;
    data[b * 20 + 3] &= 0xbb;
  }
  std::vector<float> all(blocks * 32);
  ASSERT_TRUE(DequantizeToF32(3, data.data(), data.size(), all.size(), all.data()).ok());
  for (size_t b = 0; b < blocks; b += 997) {
    float one[32];
    ASSERT_TRUE(DequantizeToF32(3, data.data() + b * 20, 20, 32, one).ok());
    EXPECT_EQ(std::memcmp(one, all.data() + b * 32, sizeof(one)), 0) << b;
  }
  std::vector<uint16_t> bf(all.size());
  ASSERT_TRUE(DequantizeToBf16(3, data.data(), data.size(), bf.size(), bf.data()).ok());
  for (size_t i = 0; i < all.size(); i += 1009) EXPECT_EQ(bf[i], FloatToBf16(all[i])) << i;
}

TEST(DequantizeTest, BadInputsAreErrors) {
  std::vector<uint8_t> data(144);
  float out[256];
  EXPECT_EQ(DequantizeToF32(10, data.data(), 84, 256, out).code(),
            absl::StatusCode::kUnimplemented);  // Q2_K
  EXPECT_EQ(DequantizeToF32(12, data.data(), data.size(), 128, out).code(),
            absl::StatusCode::kInvalidArgument);  // half a Q4_K block
  EXPECT_TRUE(DequantizeToF32(12, data.data(), data.size(), 256, out).ok());
  EXPECT_EQ(DequantizeToF32(3, data.data(), 19, 32, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeToF32(3, data.data(), 20, 31, out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GgmlDataSize(3, 64), 40u);
  EXPECT_EQ(GgmlDataSize(3, 63), 0u);
  EXPECT_EQ(GgmlTypeName(3), "Q4_1");
}

}  // namespace
}  // namespace ferry
