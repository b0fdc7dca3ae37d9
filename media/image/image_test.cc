// Decoding's refusals and limits, the probe, orientation and the config reader. Pixel values are
// checked against PIL and transformers in preprocess_reference_test, not here.
#include "media/image/image.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "media/image/preprocess.h"

namespace ferry::media {
namespace {

std::string Corpus(const std::string& name) {
  std::ifstream f("media/image/testdata/fuzz_corpus/" + name, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  EXPECT_FALSE(s.str().empty()) << name;
  return s.str();
}

void ExpectInvalid(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s;
}

TEST(ImageTest, DecodesEveryColourTypeToRgb) {
  for (const char* name : {"rgb.png", "rgba.png", "grey.png", "grey_alpha.png", "bilevel.png",
                           "palette_trns.png", "grey16.png", "rgb16.png", "base.jpg",
                           "progressive.jpg", "grey.jpg", "s444.jpg", "orient6.jpg"}) {
    std::string bytes = Corpus(name);
    absl::StatusOr<ImageInfo> info = ProbeImage(bytes);
    ASSERT_TRUE(info.ok()) << name << info.status();
    absl::StatusOr<RgbImage> image = DecodeImage(bytes);
    ASSERT_TRUE(image.ok()) << name << image.status();
    EXPECT_EQ(image->width, info->width) << name;
    EXPECT_EQ(image->height, info->height) << name;
    EXPECT_EQ(image->pixels.size(), size_t(image->width) * image->height * 3) << name;
  }
}

TEST(ImageTest, GreyIsReplicated) {
  absl::StatusOr<RgbImage> image = DecodeImage(Corpus("grey.png"));
  ASSERT_TRUE(image.ok());
  for (size_t i = 0; i < image->pixels.size(); i += 3) {
    EXPECT_EQ(image->pixels[i], image->pixels[i + 1]);
    EXPECT_EQ(image->pixels[i], image->pixels[i + 2]);
  }
}

TEST(ImageTest, RefusesTruncatedAndMalformed) {
  ExpectInvalid(DecodeImage(Corpus("truncated_rgb.png")).status(), "truncated");
  ExpectInvalid(DecodeImage(Corpus("truncated_base.jpg")).status(), "truncated");
  ExpectInvalid(DecodeImage("GIF89a....").status(), "not a PNG or JPEG");
  ExpectInvalid(DecodeImage("").status(), "not a PNG or JPEG");
  std::string png = Corpus("rgb.png");
  ExpectInvalid(DecodeImage(png.substr(0, 20)).status(), "truncated PNG header");
  ExpectInvalid(DecodeImage(std::string("\xff\xd8\xff", 3)).status(), "truncated JPEG");
}

TEST(ImageTest, LimitsAreCheckedFromTheHeader) {
  // A PNG whose IHDR claims 100000 x 100000 (the CRC is not even read: the probe refuses first).
  std::string png = Corpus("rgb.png");
  png[16] = 0, png[17] = 1, png[18] = static_cast<char>(0x86), png[19] = static_cast<char>(0xA0);
  png[20] = 0, png[21] = 1, png[22] = static_cast<char>(0x86), png[23] = static_cast<char>(0xA0);
  ExpectInvalid(ProbeImage(png).status(), "exceeds the limit");
  ExpectInvalid(DecodeImage(png).status(), "exceeds the limit");
  ImageLimits small;
  small.max_pixels = 20;
  ExpectInvalid(DecodeImage(Corpus("rgb.png"), small).status(), "pixels, over the limit");
  ExpectInvalid(DecodeImage(Corpus("base.jpg"), small).status(), "pixels, over the limit");
  small = ImageLimits();
  small.max_input_bytes = 10;
  ExpectInvalid(DecodeImage(Corpus("base.jpg"), small).status(), "bytes, over the limit");
}

TEST(ImageTest, BombsAreRefusedOrSkipped) {
  // 20000 x 20000 claimed over a few bytes: refused from the header, nothing inflated.
  ExpectInvalid(DecodeImage(Corpus("huge_dims.png")).status(), "exceeds the limit");
  // A zTXt that inflates to 64 MiB: text is skipped unread, the image decodes.
  absl::StatusOr<RgbImage> image = DecodeImage(Corpus("ztxt_bomb.png"));
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ(image->pixels, DecodeImage(Corpus("rgb.png"))->pixels);
}

TEST(ImageTest, CmykJpegDecodesAsPilConvertsIt) {
  // cmyk.jpg: PIL's CMYK save; the pixel values against PIL are preprocess_reference_test's.
  auto image = DecodeImage(Corpus("cmyk.jpg"));
  ASSERT_TRUE(image.ok()) << image.status();
  auto info = ProbeImage(Corpus("cmyk.jpg"));
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->channels, 4);
  EXPECT_EQ(image->width, info->width);
  EXPECT_EQ(image->pixels.size(), static_cast<size_t>(3 * info->width * info->height));
}

TEST(ImageTest, JpegScanCountIsBounded) {
  ImageLimits one_scan;
  one_scan.max_jpeg_scans = 1;
  ExpectInvalid(DecodeImage(Corpus("progressive.jpg"), one_scan).status(), "scans");
  EXPECT_TRUE(DecodeImage(Corpus("base.jpg"), one_scan).ok());
}

TEST(ImageTest, OrientationFromExif) {
  std::string bytes = Corpus("orient6.jpg");
  absl::StatusOr<ImageInfo> info = ProbeImage(bytes);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->orientation, 6);
  EXPECT_EQ(ProbeImage(Corpus("base.jpg"))->orientation, 1);
  RgbImage image = *DecodeImage(bytes);
  RgbImage turned = ApplyOrientation(image, 6);
  EXPECT_EQ(turned.width, image.height);
  EXPECT_EQ(turned.height, image.width);
  RgbImage back = ApplyOrientation(turned, 8);  // clockwise then counter-clockwise
  EXPECT_EQ(back.pixels, image.pixels);
  EXPECT_EQ(ApplyOrientation(ApplyOrientation(image, 3), 3).pixels, image.pixels);
}

constexpr char kLlava[] = R"({
  "crop_size": {"height": 336, "width": 336}, "do_center_crop": true, "do_convert_rgb": true,
  "do_normalize": true, "do_rescale": true, "do_resize": true,
  "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
  "image_std": [0.26862954, 0.26130258, 0.27577711], "processor_class": "LlavaProcessor",
  "resample": 3, "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 336}})";

TEST(PreprocessTest, ReadsClipAndRefusesWhatItDoesNotImplement) {
  absl::StatusOr<PreprocessConfig> c = ParsePreprocessorConfig(kLlava);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shortest_edge, 336);
  EXPECT_EQ(c->crop_height, 336);
  EXPECT_EQ(c->resample, Resample::kBicubic);
  ExpectInvalid(
      ParsePreprocessorConfig(R"({"image_processor_type": "Qwen2VLImageProcessor"})").status(),
      "Qwen2VLImageProcessor");
  ExpectInvalid(
      ParsePreprocessorConfig(R"({"image_processor_type": "CLIPImageProcessor", "do_pad": true})")
          .status(),
      "do_pad");
  ExpectInvalid(
      ParsePreprocessorConfig(R"({"image_processor_type": "CLIPImageProcessor", "resample": 1})")
          .status(),
      "resample");
  ExpectInvalid(ParsePreprocessorConfig(
                    R"({"image_processor_type": "SiglipImageProcessor", "do_center_crop": true})")
                    .status(),
                "do_center_crop");
  ExpectInvalid(ParsePreprocessorConfig("[1").status(), "not a JSON object");
}

TEST(PreprocessTest, ShapesAndPadding) {
  PreprocessConfig c = *ParsePreprocessorConfig(kLlava);
  RgbImage image = *DecodeImage(Corpus("base.jpg"));  // 16 x 12
  absl::StatusOr<PixelValues> px = Preprocess(image, c);
  ASSERT_TRUE(px.ok());
  EXPECT_EQ(px->height, 336);
  EXPECT_EQ(px->width, 336);
  EXPECT_EQ(px->data.size(), 3u * 336 * 336);
  // A crop larger than the image pads with zeros around it, as transformers' center_crop.
  RgbImage crop = CenterCrop(image, 20, 14);
  EXPECT_EQ(crop.width, 20);
  EXPECT_EQ(crop.pixels[0], 0);
  EXPECT_EQ(crop.pixels[(1 * 20 + 2) * 3], image.pixels[0]);
  EXPECT_EQ(ResizePil(image, 16, 12, Resample::kBicubic).pixels, image.pixels);
}

}  // namespace
}  // namespace ferry::media
