#include "engine/common/block_hash.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

// Golden vectors printed by `tools/python/block_hash_reference.py golden`, an implementation
// of the specification in block_hash.h on Python's xxhash package.
constexpr char kFingerprint[] = "302b7cc4e2f162ba5236479467e2b990";  // XXH3-128("example model")

BlockHashScope Scope(std::string salt = "", std::string lora = "") {
  return BlockHashScope{*Hash128::FromHex(kFingerprint), std::move(salt), std::move(lora)};
}

std::vector<std::string> Hex(const std::vector<Hash128>& hashes) {
  std::vector<std::string> out;
  for (const Hash128& h : hashes) out.push_back(h.ToHex());
  return out;
}

TEST(BlockHashTest, FingerprintInputMatchesReference) {
  EXPECT_EQ(Xxh3Hash128("example model").ToHex(), kFingerprint);
}

TEST(BlockHashTest, RootGoldenVectors) {
  EXPECT_EQ(RootBlockHash(Scope()).ToHex(), "cf9e889b7a07615ca08fb3a97640c0e8");
  EXPECT_EQ(RootBlockHash(Scope("tenant-a")).ToHex(), "e2a683e42e9e999c664f8be65f66e98a");
  EXPECT_EQ(RootBlockHash(Scope("", "adapter-1")).ToHex(), "da816aaf45b2b448f614bda5885fbbfc");
}

TEST(BlockHashTest, RootEncodingIsTheSpecifiedBytes) {
  const std::string bytes = EncodeRootForHash(Scope("ab", "x"));
  ASSERT_EQ(bytes.size(), 8u + 4 + 16 + 4 + 2 + 4 + 1);
  EXPECT_EQ(bytes.substr(0, 8), std::string("FERRYBH\0", 8));
  EXPECT_EQ(bytes.substr(8, 4), std::string("\x01\x00\x00\x00", 4));
  // Fingerprint low half first, little-endian: lo = 0x5236479467e2b990.
  EXPECT_EQ(bytes.substr(12, 8), std::string("\x90\xb9\xe2\x67\x94\x47\x36\x52", 8));
  EXPECT_EQ(bytes.substr(28, 6), std::string("\x02\x00\x00\x00"
                                             "ab",
                                             6));
  EXPECT_EQ(bytes.substr(34, 5), std::string("\x01\x00\x00\x00"
                                             "x",
                                             5));
}

TEST(BlockHashTest, ChainGoldenVectorsAndPartialBlockIgnored) {
  std::vector<TokenId> tokens = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(Hex(ComputeBlockHashes(Scope(), tokens, 4)),
            (std::vector<std::string>{"b5ab5e6393f9b9b9e3a098a883ad98bc",
                                      "bada9625d3a7010895654443e5aa1547"}));
}

TEST(BlockHashTest, TokensAreUnsigned32Bit) {
  std::vector<TokenId> tokens = {0xFFFFFFFFu, 0x80000000u, 1, 0, 0xFFFFFFFFu, 0x80000000u, 1, 0};
  EXPECT_EQ(Hex(ComputeBlockHashes(Scope(), tokens, 4)),
            (std::vector<std::string>{"e564929283b99636f756025a88950179",
                                      "a3bbd84bbefe43307d973ac94e5262ba"}));
}

TEST(BlockHashTest, ImagesEnterEveryBlockTheyOverlap) {
  std::vector<TokenId> tokens;
  for (TokenId t = 100; t < 112; ++t) tokens.push_back(t);
  const PromptImageSpan image{Xxh3Hash128("image bytes"), /*start=*/2, /*length=*/5};
  EXPECT_EQ(Hex(ComputeBlockHashes(Scope(), tokens, 4, {&image, 1})),
            (std::vector<std::string>{"400db5668d25b4feeebad667b986b5db",
                                      "91a045d56a30292e294aeaaf65c7ffb8",
                                      "22ec4c4a4e8d45a7bb2ed774f98f1ed3"}));
}

TEST(BlockHashTest, SharedPrefixSharesHashesUntilTheFirstDifference) {
  std::vector<TokenId> a(64 * 5), b;
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<TokenId>(i * 7919 % 49152);
  b = a;
  b[64 * 3 + 10] += 1;  // differs in block 3
  const auto ha = ComputeBlockHashes(Scope(), a, 64);
  const auto hb = ComputeBlockHashes(Scope(), b, 64);
  ASSERT_EQ(ha.size(), 5u);
  ASSERT_EQ(hb.size(), 5u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ha[i], hb[i]) << i;
  for (int i = 3; i < 5; ++i) EXPECT_NE(ha[i], hb[i]) << i;
}

TEST(BlockHashTest, SaltModelAndAdapterSeparateCaches) {
  std::vector<TokenId> tokens(128, 42);
  const auto base = ComputeBlockHashes(Scope(), tokens, 64);
  EXPECT_NE(ComputeBlockHashes(Scope("tenant-a"), tokens, 64)[0], base[0]);
  EXPECT_NE(ComputeBlockHashes(Scope("", "lora"), tokens, 64)[0], base[0]);
  BlockHashScope other_model = Scope();
  other_model.model_fingerprint.lo ^= 1;
  EXPECT_NE(ComputeBlockHashes(other_model, tokens, 64)[0], base[0]);
  // Salt and adapter are length-prefixed: moving a byte between them changes the hash.
  EXPECT_NE(RootBlockHash(Scope("ab", "c")), RootBlockHash(Scope("a", "bc")));
}

TEST(BlockHashTest, IncrementalEqualsBatch) {
  std::vector<TokenId> tokens(64 * 3 + 5);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<TokenId>(i * 31);
  const auto batch = ComputeBlockHashes(Scope(), tokens, 64);
  Hash128 h = RootBlockHash(Scope());
  for (size_t b = 0; b < batch.size(); ++b) {
    h = NextBlockHash(h, absl::MakeConstSpan(tokens).subspan(b * 64, 64), {});
    EXPECT_EQ(h, batch[b]);
  }
}

TEST(BlockHashTest, NoFullBlockNoHashes) {
  std::vector<TokenId> tokens(63, 1);
  EXPECT_TRUE(ComputeBlockHashes(Scope(), tokens, 64).empty());
  EXPECT_TRUE(ComputeBlockHashes(Scope(), {}, 64).empty());
}

}  // namespace
}  // namespace ferry
