#include "engine/common/hash128.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(Hash128Test, KnownXxh3Values) {
  // XXH3-128 of the empty input, as published by xxHash and printed by Python's xxhash.
  EXPECT_EQ(Xxh3Hash128("").ToHex(), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(Xxh3Hash128("").hi, 0x99aa06d3014798d8u);
  EXPECT_EQ(Xxh3Hash128("").lo, 0x6001c324468d497fu);
  EXPECT_EQ(Xxh3Hash128("ferry").ToHex(), "85ca3a0dfcfe59849331f43fcdbd2eb8");
}

TEST(Hash128Test, HexRoundTripAndErrors) {
  const Hash128 h{0x0123456789abcdefu, 0xfedcba9876543210u};
  EXPECT_EQ(h.ToHex(), "fedcba98765432100123456789abcdef");
  auto back = Hash128::FromHex(h.ToHex());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, h);
  EXPECT_EQ(*Hash128::FromHex("FEDCBA98765432100123456789ABCDEF"), h);
  EXPECT_FALSE(Hash128::FromHex("abc").ok());
  EXPECT_FALSE(Hash128::FromHex("zedcba98765432100123456789abcdef").ok());
}

TEST(Hash128Test, OrderingAndHashing) {
  const Hash128 a{5, 1}, b{1, 2}, c{6, 1};
  EXPECT_LT(a, b);  // high half compares first
  EXPECT_LT(a, c);
  absl::flat_hash_set<Hash128> set = {a, b, c, a};
  EXPECT_EQ(set.size(), 3u);
}

TEST(Hash128Test, StreamingEqualsOneShot) {
  std::string data;
  for (int i = 0; i < 100000; ++i) data.push_back(static_cast<char>(i * 131));
  Xxh3Hasher128 hasher;
  hasher.Update(absl::string_view(data).substr(0, 7));
  hasher.Update(absl::string_view(data).substr(7, 60000));
  hasher.Update(absl::string_view(data).substr(60007));
  EXPECT_EQ(hasher.Finish(), Xxh3Hash128(data));
}

TEST(Hash128Test, DigestFile) {
  std::string data(9 << 20, 'x');  // larger than the 4 MiB read buffer
  data[12345] = 'y';
  const std::string path = ::testing::TempDir() + "/digest.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << data;
  }
  auto digest = DigestFile(path);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, Xxh3Hash128(data));
  std::remove(path.c_str());
  EXPECT_EQ(DigestFile(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ferry
