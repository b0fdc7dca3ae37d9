#include "engine/common/model_fingerprint.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace ferry {
namespace {

ModelFingerprintBuilder Example() {
  ModelFingerprintBuilder builder;
  builder.AddFile("model.safetensors", Xxh3Hash128("weights"));
  builder.AddFile("config.json", Xxh3Hash128("config"));
  builder.SetTokenizerDigest(Xxh3Hash128("tokenizer"));
  builder.SetKvLayout(KvLayout{"bf16", 30, 3, 64});
  builder.SetWeightDtype("f32");
  return builder;
}

TEST(ModelFingerprintTest, GoldenVector) {
  // From `tools/python/block_hash_reference.py golden`.
  auto fp = Example().Finish();
  ASSERT_TRUE(fp.ok()) << fp.status();
  EXPECT_EQ(fp->ToHex(), "084df50c105eece8312630fc99ae06e6");
}

TEST(ModelFingerprintTest, VisionExtensionCoversBothParts) {
  const Hash128 text = Xxh3Hash128("text"), vision = Xxh3Hash128("vision");
  const Hash128 fp = ExtendModelFingerprint(text, vision);
  EXPECT_EQ(fp, ExtendModelFingerprint(text, vision));
  EXPECT_NE(fp, text);
  EXPECT_NE(fp, ExtendModelFingerprint(Xxh3Hash128("text2"), vision));
  EXPECT_NE(fp, ExtendModelFingerprint(text, Xxh3Hash128("vision2")));
  EXPECT_NE(fp, ExtendModelFingerprint(vision, text));  // the order of the parts matters
  // Another computation: its own fingerprint, by the encoding's bytes.
  const Hash128 cuda = ExtendModelFingerprintForCompute(text, "backend=cuda");
  EXPECT_NE(cuda, text);
  EXPECT_NE(cuda, ExtendModelFingerprintForCompute(text, "backend=cuda:deterministic"));
  std::string bytes = "FERRYCMP";
  for (uint64_t half : {text.lo, text.hi}) {
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((half >> (8 * i)) & 0xff));
  }
  bytes += std::string("\x0c\0\0\0", 4) + "backend=cuda";
  EXPECT_EQ(cuda, Xxh3Hash128(bytes));
}

TEST(ModelFingerprintTest, FileOrderDoesNotMatter) {
  ModelFingerprintBuilder reversed;
  reversed.AddFile("config.json", Xxh3Hash128("config"));
  reversed.AddFile("model.safetensors", Xxh3Hash128("weights"));
  reversed.SetTokenizerDigest(Xxh3Hash128("tokenizer"));
  reversed.SetKvLayout(KvLayout{"bf16", 30, 3, 64});
  reversed.SetWeightDtype("f32");
  EXPECT_EQ(*reversed.Finish(), *Example().Finish());
}

TEST(ModelFingerprintTest, EveryInputChangesIt) {
  const Hash128 base = *Example().Finish();
  {
    ModelFingerprintBuilder b = Example();
    b.AddFile("extra.safetensors", Xxh3Hash128("more weights"));
    EXPECT_NE(*b.Finish(), base);
  }
  {
    ModelFingerprintBuilder b;
    b.AddFile("model.safetensors", Xxh3Hash128("new weights, same name"));
    b.AddFile("config.json", Xxh3Hash128("config"));
    b.SetTokenizerDigest(Xxh3Hash128("tokenizer"));
    b.SetKvLayout(KvLayout{"bf16", 30, 3, 64});
    b.SetWeightDtype("f32");
    EXPECT_NE(*b.Finish(), base);
  }
  {
    ModelFingerprintBuilder b = Example();
    b.SetWeightDtype("bf16");  // the same files computed in bf16 give other KV
    EXPECT_NE(*b.Finish(), base);
  }
  for (const KvLayout& layout :
       {KvLayout{"f16", 30, 3, 64}, KvLayout{"bf16", 29, 3, 64}, KvLayout{"bf16", 30, 4, 64},
        KvLayout{"bf16", 30, 3, 128}, KvLayout{"bf16", 30, 3, 64, kKvFormatVersion + 1}}) {
    ModelFingerprintBuilder b = Example();
    b.SetKvLayout(layout);
    EXPECT_NE(*b.Finish(), base) << layout.dtype << " " << layout.cached_layers;
  }
  ModelFingerprintBuilder b = Example();
  b.SetTokenizerDigest(Xxh3Hash128("other tokenizer"));
  EXPECT_NE(*b.Finish(), base);
}

TEST(ModelFingerprintTest, MissingOrInvalidInputsAreErrors) {
  EXPECT_EQ(ModelFingerprintBuilder().Finish().status().code(),
            absl::StatusCode::kFailedPrecondition);
  {
    ModelFingerprintBuilder b = Example();
    b.SetKvLayout(KvLayout{"int4", 30, 3, 64});
    EXPECT_EQ(b.Finish().status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(b.Finish().status().message().find("int4"), absl::string_view::npos);
  }
  {
    ModelFingerprintBuilder b = Example();
    b.SetKvLayout(KvLayout{"bf16", 0, 3, 64});
    EXPECT_EQ(b.Finish().status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    ModelFingerprintBuilder b = Example();
    b.AddFile("config.json", Xxh3Hash128("another config"));
    EXPECT_EQ(b.Finish().status().code(), absl::StatusCode::kInvalidArgument);
  }
  {
    ModelFingerprintBuilder b;
    b.AddFile("model.gguf", Xxh3Hash128("gguf"));
    b.SetKvLayout(KvLayout{"bf16", 30, 3, 64});
    EXPECT_EQ(b.Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    ModelFingerprintBuilder b = Example();
    b.SetWeightDtype("int8");
    EXPECT_EQ(b.Finish().status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(ModelFingerprintTest, AddFileFromDiskDigestsContent) {
  const std::string path = ::testing::TempDir() + "/fp_weights.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out << "weights";
  }
  ModelFingerprintBuilder from_disk;
  ASSERT_TRUE(from_disk.AddFileFromDisk("model.safetensors", path).ok());
  from_disk.AddFile("config.json", Xxh3Hash128("config"));
  from_disk.SetTokenizerDigest(Xxh3Hash128("tokenizer"));
  from_disk.SetKvLayout(KvLayout{"bf16", 30, 3, 64});
  from_disk.SetWeightDtype("f32");
  EXPECT_EQ(*from_disk.Finish(), *Example().Finish());

  ModelFingerprintBuilder missing;
  const absl::Status status = missing.AddFileFromDisk("x", path + ".does-not-exist");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ferry
