// ImageEncoder on a hand-written LLaVA directory (engine/model/vision/test_model.h) and the real
// PNG and JPEG files of media/image's corpus: the bytes' path to embedding rows, its
// determinism, and the errors a request can cause (a unit test, so the sanitizer pass runs the
// worker's whole image path; the numbers are checked against transformers by
// engine/llava_reference_test).

#include "services/vision/image_encoder.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/hash128.h"
#include "engine/model/vision/test_model.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::string CorpusImage(const std::string& name) {
  std::ifstream in(
      absl::StrCat(std::getenv("TEST_SRCDIR"), "/ferry/media/image/testdata/fuzz_corpus/", name),
      std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The test model's directory with a CLIP image processor for its 4-px tower.
std::string ModelDir(const std::string& name) {
  const std::string dir =
      testing_model::WriteModel(name, testing_model::Config(), testing_model::Weights());
  std::ofstream(dir + "/preprocessor_config.json") << R"({
    "image_processor_type": "CLIPImageProcessor", "do_resize": true, "size": {"shortest_edge": 4},
    "resample": 3, "do_center_crop": true, "crop_size": {"height": 4, "width": 4},
    "do_rescale": true, "rescale_factor": 0.00392156862745098, "do_normalize": true,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711]})";
  return dir;
}

std::unique_ptr<ImageEncoder> Make(const std::string& dir, VisionPrecision precision,
                                   const media::ImageLimits& limits = {}) {
  auto tower = VisionTower::Load(dir, precision);
  EXPECT_TRUE(tower.ok()) << tower.status();
  auto encoder = ImageEncoder::Create(dir, *std::move(tower), limits);
  EXPECT_TRUE(encoder.ok()) << encoder.status();
  return encoder.ok() ? *std::move(encoder) : nullptr;
}

TEST(ImageEncoderTest, RealImagesGiveDeterministicRowsPerImage) {
  const std::string dir = ModelDir("ok");
  for (VisionPrecision precision : {VisionPrecision::kF32, VisionPrecision::kBf16}) {
    auto encoder = Make(dir, precision);
    ASSERT_NE(encoder, nullptr);
    EXPECT_EQ(encoder->num_image_tokens(), 4);
    EXPECT_EQ(encoder->hidden_size(), 6);
    std::vector<std::vector<float>> seen;
    for (const char* name : {"rgb.png", "rgba.png", "grey.png", "palette_trns.png", "rgb16.png",
                             "base.jpg", "grey.jpg", "orient6.jpg", "progressive.jpg"}) {
      const std::string bytes = CorpusImage(name);
      auto rows = encoder->Encode(bytes, Xxh3Hash128(bytes), 4);
      ASSERT_TRUE(rows.ok()) << name << ": " << rows.status();
      ASSERT_EQ((*rows)->size(), 4u * 6u) << name;
      auto again = encoder->Encode(bytes, Xxh3Hash128(bytes), 4);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(**again, **rows) << name;
      for (const std::vector<float>& other : seen) EXPECT_NE(other, **rows) << name;
      seen.push_back(**rows);
    }
  }
}

TEST(ImageEncoderTest, WhatARequestGetsWrongIsInvalidArgumentSayingWhy) {
  auto encoder = Make(ModelDir("errors"), VisionPrecision::kF32);
  ASSERT_NE(encoder, nullptr);
  const std::string png = CorpusImage("rgb.png");
  auto expect = [](const absl::Status& s, const std::string& words) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(words), absl::string_view::npos) << s;
  };
  expect(encoder->Encode(png, Xxh3Hash128(png), 5).status(), "5 placeholder tokens");
  expect(encoder->Encode(png, Xxh3Hash128("another image"), 4).status(), "is not the image");
  // (A zTXt bomb is not an error: its text chunks are skipped without inflating them.)
  for (const char* name : {"truncated_rgb.png", "truncated_base.jpg", "huge_dims.png"}) {
    const std::string bytes = CorpusImage(name);
    const absl::Status s = encoder->Encode(bytes, Xxh3Hash128(bytes), 4).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << ": " << s;
    EXPECT_FALSE(s.message().empty()) << name;
  }
  const std::string junk = "not an image at all";
  EXPECT_EQ(encoder->Encode(junk, Xxh3Hash128(junk), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The worker's decoding limits apply: a pixel cap below the image's refuses it.
  media::ImageLimits small;
  small.max_pixels = 16;
  auto capped = Make(ModelDir("capped"), VisionPrecision::kF32, small);
  ASSERT_NE(capped, nullptr);
  expect(capped->Encode(png, Xxh3Hash128(png), 4).status(), "");
}

TEST(ImageEncoderTest, ADirectoryWithoutItsProcessorConfigIsNotFound) {
  const std::string dir =
      testing_model::WriteModel("no_processor", testing_model::Config(), testing_model::Weights());
  auto tower = VisionTower::Load(dir);
  ASSERT_TRUE(tower.ok());
  auto encoder = ImageEncoder::Create(dir, *std::move(tower), {});
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(encoder.status().message().find("preprocessor_config.json"), absl::string_view::npos);
}

}  // namespace
}  // namespace ferry
