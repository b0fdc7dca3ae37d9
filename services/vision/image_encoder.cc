#include "services/vision/image_encoder.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<ImageEncoder>> ImageEncoder::Create(
    const std::string& dir, VisionTower tower, const media::ImageLimits& limits) {
  const std::string path = dir + "/preprocessor_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot read it (a vision model's image processor configuration)"));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<media::PreprocessConfig> preprocess = media::ParsePreprocessorConfig(text.str());
  if (!preprocess.ok()) {
    return absl::Status(preprocess.status().code(),
                        absl::StrCat(path, ": ", preprocess.status().message()));
  }
  return std::unique_ptr<ImageEncoder>(
      new ImageEncoder(std::move(tower), *std::move(preprocess), limits));
}

absl::StatusOr<std::shared_ptr<const std::vector<float>>> ImageEncoder::Encode(
    absl::string_view bytes, const Hash128& content_hash, int64_t placeholder_length) const {
  if (placeholder_length != num_image_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat(placeholder_length, " placeholder tokens; this model's vision tower gives ",
                     num_image_tokens(), " rows per image"));
  }
  const Hash128 actual = Xxh3Hash128(bytes);
  if (actual != content_hash) {
    return absl::InvalidArgumentError(
        absl::StrCat("content_hash ", content_hash.ToHex(),
                     " is not the image bytes' (XXH3-128: ", actual.ToHex(), ")"));
  }
  absl::StatusOr<media::ImageInfo> info = media::ProbeImage(bytes, limits_);
  if (!info.ok()) return absl::InvalidArgumentError(info.status().message());
  absl::StatusOr<media::RgbImage> decoded = media::DecodeImage(bytes, limits_);
  if (!decoded.ok()) return absl::InvalidArgumentError(decoded.status().message());
  const media::RgbImage image = media::ApplyOrientation(*decoded, info->orientation);
  absl::StatusOr<media::PixelValues> pixels = media::Preprocess(image, preprocess_);
  if (!pixels.ok()) return absl::InvalidArgumentError(pixels.status().message());
  ASSIGN_OR_RETURN(std::vector<float> rows, tower_.Encode(pixels->data));
  return std::make_shared<const std::vector<float>>(std::move(rows));
}

}  // namespace ferry
