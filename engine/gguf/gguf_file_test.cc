#include "engine/gguf/gguf_file.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace ferry {
namespace {

// Builds GGUF images by hand, from the specification, to test the parser's edges.
class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) {
    U32(0x46554747);
    U32(version);
    count_at_ = bytes_.size();
    U64(0);  // tensor count, patched by Finish
    U64(0);  // kv count, patched by Finish
  }
  GgufBuilder& KeyU32(const std::string& key, uint32_t v) {
    Str(key);
    U32(4);
    U32(v);
    ++kvs_;
    return *this;
  }
  GgufBuilder& KeyStr(const std::string& key, const std::string& v) {
    Str(key);
    U32(8);
    Str(v);
    ++kvs_;
    return *this;
  }
  GgufBuilder& KeyStrArray(const std::string& key, const std::vector<std::string>& vs) {
    Str(key);
    U32(9);
    U32(8);
    U64(vs.size());
    for (const auto& v : vs) Str(v);
    ++kvs_;
    return *this;
  }
  GgufBuilder& Raw(const std::string& raw) {
    bytes_ += raw;
    return *this;
  }
  GgufBuilder& Tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t type,
                      uint64_t offset) {
    tensor_infos_.push_back({name, dims, type, offset});
    return *this;
  }
  std::string Finish(size_t data_bytes = 0, uint64_t kv_override = ~0ull) {
    for (const auto& t : tensor_infos_) {
      Str(t.name);
      U32(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) U64(d);
      U32(t.type);
      U64(t.offset);
    }
    std::string out = bytes_;
    const uint64_t tensors = tensor_infos_.size();
    const uint64_t kvs = kv_override != ~0ull ? kv_override : kvs_;
    std::memcpy(&out[count_at_], &tensors, 8);
    std::memcpy(&out[count_at_ + 8], &kvs, 8);
    while (out.size() % 32 != 0) out.push_back('\0');
    out.append(data_bytes, '\x01');
    return out;
  }

 private:
  struct TensorSpec {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    uint64_t offset;
  };
  void U32(uint32_t v) { bytes_.append(reinterpret_cast<const char*>(&v), 4); }
  void U64(uint64_t v) { bytes_.append(reinterpret_cast<const char*>(&v), 8); }
  void Str(const std::string& s) {
    U64(s.size());
    bytes_ += s;
  }
  std::string bytes_;
  size_t count_at_ = 0;
  uint64_t kvs_ = 0;
  std::vector<TensorSpec> tensor_infos_;
};

TEST(GgufFileTest, ParsesMetadataAndTensors) {
  const std::string image = GgufBuilder()
                                .KeyStr("general.architecture", "llama")
                                .KeyU32("llama.block_count", 30)
                                .KeyStrArray("tokenizer.ggml.tokens", {"a", "b", "<|im_end|>"})
                                .Tensor("w", {32, 2}, /*F32=*/0, 0)
                                .Tensor("q", {64}, /*Q4_1=*/3, 256)
                                .Finish(/*data_bytes=*/256 + 40);
  auto file = GgufFile::FromBuffer(image);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 3u);
  EXPECT_EQ(*(*file)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*file)->GetInt("llama.block_count"), 30);
  auto tokens = (*file)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  EXPECT_EQ(tokens->size(), 3u);
  EXPECT_EQ((*tokens)[2], "<|im_end|>");
  ASSERT_EQ((*file)->tensors().size(), 2u);
  EXPECT_EQ((*file)->tensors()[0].size_bytes, 256u);
  EXPECT_EQ((*file)->tensors()[1].size_bytes, 40u);  // 2 blocks of 32 x 20 bytes
  EXPECT_EQ((*file)->tensors()[1].data - (*file)->tensors()[0].data, 256);
}

TEST(GgufFileTest, TypedAccessorsNameTheKey) {
  const std::string image = GgufBuilder().KeyStr("s", "x").KeyU32("n", 1).Finish();
  auto file = GgufFile::FromBuffer(image);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->GetString("missing").status().code(), absl::StatusCode::kNotFound);
  const absl::Status wrong = (*file)->GetInt("s").status();
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("'s' is string"), absl::string_view::npos) << wrong;
  EXPECT_FALSE((*file)->GetStringArray("n").ok());
  EXPECT_FALSE((*file)->GetBool("n").ok());
}

TEST(GgufFileTest, EveryTruncationIsAnErrorNotACrash) {
  const std::string image = GgufBuilder()
                                .KeyStr("general.architecture", "llama")
                                .KeyStrArray("tokenizer.ggml.tokens", {"a", "b"})
                                .Tensor("w", {32}, 0, 0)
                                .Finish(128);
  ASSERT_TRUE(GgufFile::FromBuffer(image).ok());
  for (size_t n = 0; n < image.size() - 128 + 127; ++n) {
    // Copy so that AddressSanitizer sees reads past the truncated end.
    const std::string truncated = image.substr(0, n);
    auto file = GgufFile::FromBuffer(truncated);
    EXPECT_FALSE(file.ok()) << "accepted a file truncated to " << n << " bytes";
  }
}

TEST(GgufFileTest, CorruptHeadersAreRefusedClearly) {
  EXPECT_NE(GgufFile::FromBuffer("GGML1234").status().message().find("bad magic"),
            absl::string_view::npos);
  EXPECT_NE(GgufFile::FromBuffer(GgufBuilder(1).Finish()).status().message().find("version 1"),
            absl::string_view::npos);
  // More key-values claimed than the file could hold.
  EXPECT_FALSE(GgufFile::FromBuffer(GgufBuilder().Finish(0, 1ull << 60)).ok());
  // A string whose length runs past the end.
  const std::string long_string = GgufBuilder().Raw("").Finish();
  std::string bad = GgufBuilder().KeyStr("k", "v").Finish();
  const uint64_t huge = 1ull << 50;
  std::memcpy(&bad[24 + 8 + 1 + 4], &huge, 8);  // the value's length field
  EXPECT_FALSE(GgufFile::FromBuffer(bad).ok());
  // Duplicate keys.
  EXPECT_NE(GgufFile::FromBuffer(GgufBuilder().KeyU32("a", 1).KeyU32("a", 2).Finish())
                .status()
                .message()
                .find("duplicate key"),
            absl::string_view::npos);
  // Tensor data past the end, a misaligned offset, a row not a multiple of the block.
  EXPECT_FALSE(GgufFile::FromBuffer(GgufBuilder().Tensor("w", {32}, 0, 0).Finish(100)).ok());
  EXPECT_FALSE(GgufFile::FromBuffer(GgufBuilder().Tensor("w", {8}, 0, 4).Finish(64)).ok());
  EXPECT_FALSE(GgufFile::FromBuffer(GgufBuilder().Tensor("w", {33}, 3, 0).Finish(64)).ok());
  EXPECT_FALSE(GgufFile::FromBuffer(GgufBuilder().Tensor("w", {}, 0, 0).Finish(64)).ok());
}

TEST(GgufFileTest, OpenReportsMissingFilesWithThePath) {
  const absl::Status status = GgufFile::Open("/nonexistent/model.gguf").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("/nonexistent/model.gguf"), absl::string_view::npos);
}

TEST(GgufFileTest, ReadsAFileWrittenByTheGgufPackage) {
  // testdata/corpus/small.gguf was written by the `gguf` Python package (llama.cpp's writer).
  auto file = GgufFile::Open("engine/gguf/testdata/corpus/small.gguf");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(*(*file)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*file)->GetInt("test.u32"), 7);
  EXPECT_EQ(*(*file)->GetInt("test.i32"), -3);
  EXPECT_EQ(*(*file)->GetInt("test.u64"), int64_t{1} << 40);
  EXPECT_EQ(*(*file)->GetInt("test.i8"), -8);
  EXPECT_DOUBLE_EQ(*(*file)->GetFloat("test.f32"), 1.5);
  EXPECT_DOUBLE_EQ(*(*file)->GetFloat("test.f64"), 2.25);
  EXPECT_TRUE(*(*file)->GetBool("test.bool"));
  EXPECT_EQ(*(*file)->GetString("test.str"), "h\xc3\xa9llo");
  EXPECT_EQ((*(*file)->GetStringArray("test.strs"))[2], "<|im_start|>");
  EXPECT_EQ(*(*file)->GetIntArray("test.ints"), (std::vector<int64_t>{1, -2, 3}));
  ASSERT_EQ((*file)->tensors().size(), 2u);
  const GgufTensorInfo& f32 = (*file)->tensors()[0];
  EXPECT_EQ(f32.name, "t.f32");
  EXPECT_EQ(f32.dims, (std::vector<uint64_t>{32, 2}));
  float values[64];
  std::memcpy(values, f32.data, sizeof(values));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(values[i], static_cast<float>(i));
  EXPECT_EQ((*file)->tensors()[1].ggml_type, 1u);  // F16
}

}  // namespace
}  // namespace ferry
