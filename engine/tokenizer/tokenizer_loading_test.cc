// Loading paths and the parts of the pipeline that real vocabularies rarely exercise, checked
// against the specification's own examples (HF `tokenizers` documentation).

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::vector<std::string> SplitWith(SplitBehavior behavior) {
  auto step = PreTokenizer::SplitStep("-", behavior, /*invert=*/false);
  EXPECT_TRUE(step.ok());
  PreTokenizer pre({*step});
  std::vector<std::string> pieces;
  EXPECT_TRUE(pre.Split("the-final--countdown", true, &pieces).ok());
  std::vector<std::pair<size_t, size_t>> ranges;
  EXPECT_TRUE(pre.SplitRanges("the-final--countdown", &ranges).ok());
  std::vector<std::string> from_ranges;
  for (const auto& [b, e] : ranges)
    from_ranges.push_back(std::string("the-final--countdown").substr(b, e - b));
  EXPECT_EQ(pieces, from_ranges);
  return pieces;
}

TEST(PreTokenizerTest, SplitBehaviorsMatchTheHfDocumentation) {
  using V = std::vector<std::string>;
  EXPECT_EQ(SplitWith(SplitBehavior::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kIsolated), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kMergedWithNext), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(SplitWith(SplitBehavior::kContiguous), (V{"the", "-", "final", "--", "countdown"}));
}

TEST(TokenizerLoadingTest, GgufWithAnUnknownPreTokenizerNamesIt) {
  auto gguf = GgufFile::Open("engine/tokenizer/testdata/unknown_pre.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  const absl::Status status = Tokenizer::FromGguf(**gguf).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("'mystery-pre'"), absl::string_view::npos) << status;
  EXPECT_NE(status.message().find("smollm"), absl::string_view::npos) << status;
}

TEST(TokenizerLoadingTest, SentencePieceGgufIsRefusedClearly) {
  auto gguf = GgufFile::Open("engine/tokenizer/testdata/spm_model.gguf");
  ASSERT_TRUE(gguf.ok());
  const absl::Status status = Tokenizer::FromGguf(**gguf).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("'llama'"), absl::string_view::npos) << status;
}

TEST(TokenizerLoadingTest, TinyGgufVocabulary) {
  auto gguf = GgufFile::Open("engine/tokenizer/testdata/tiny_gpt2.gguf");
  ASSERT_TRUE(gguf.ok());
  auto tokenizer = Tokenizer::FromGguf(**gguf);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ(*(*tokenizer)->Encode("ab"), (std::vector<TokenId>{2}));
  EXPECT_EQ(*(*tokenizer)->Encode("bab"), (std::vector<TokenId>{1, 2}));
  EXPECT_EQ(*(*tokenizer)->Encode("a<|end|>", true), (std::vector<TokenId>{0, 3}));
  EXPECT_EQ((*tokenizer)->eos_id(), std::optional<TokenId>(3));
  EXPECT_TRUE((*tokenizer)->IsSpecial(3));
  EXPECT_EQ(*(*tokenizer)->Decode({1, 2, 3}), "bab<|end|>");
}

TEST(TokenizerLoadingTest, HfDirectoryWithTokenizerConfig) {
  const std::string dir = ::testing::TempDir() + "/hf_model";
  std::remove((dir + "/tokenizer_config.json").c_str());
  ASSERT_EQ(
      system(("mkdir -p " + dir + " && cp engine/tokenizer/testdata/llama3_bytelevel_600.json " +
              dir + "/tokenizer.json")
                 .c_str()),
      0);
  {
    auto plain = Tokenizer::FromHfDirectory(dir);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_FALSE((*plain)->bos_id().has_value());
  }
  {
    std::ofstream config(dir + "/tokenizer_config.json");
    config << R"({"bos_token": {"content": "<|endoftext|>", "lstrip": false},
                 "eos_token": "<|im_end|>", "add_bos_token": true, "model_max_length": 8192})";
  }
  auto tokenizer = Tokenizer::FromHfDirectory(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  ASSERT_TRUE((*tokenizer)->bos_id().has_value());
  EXPECT_EQ((*tokenizer)->TokenString(*(*tokenizer)->bos_id()), "<|endoftext|>");
  EXPECT_EQ((*tokenizer)->TokenString(*(*tokenizer)->eos_id()), "<|im_end|>");
  EXPECT_TRUE((*tokenizer)->add_bos());
  {
    std::ofstream config(dir + "/tokenizer_config.json");
    config << R"({"eos_token": "<|not_a_token|>"})";
  }
  const absl::Status bad = Tokenizer::FromHfDirectory(dir).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("<|not_a_token|>"), absl::string_view::npos) << bad;
}

}  // namespace
}  // namespace ferry
