// The vision model's image path, shared by the worker (in-process encoding) and ferry-encoder
// (services/encoder): what turns an image's encoded bytes (PNG, JPEG) into the embedding rows
// the engine takes (engine/prompt_image.h), for a --model that is a LLaVA-style directory. The
// steps follow transformers' API path (load_image, then the model's image processor, then
// get_image_features):
//
//   content hash check (XXH3-128 of the bytes as sent, seed 0: Xxh3Hash128) -> DecodeImage with
//   the worker's ImageLimits -> ApplyOrientation (EXIF; load_image rotates) -> Preprocess with
//   the directory's preprocessor_config.json -> VisionTower::Encode
//
// Errors: InvalidArgument for what the request gets wrong (a content hash that is not the bytes',
// a placeholder count that is not the tower's num_image_tokens, bytes the decoder refuses, with
// its message). Deterministic: the same bytes give the same rows bit for bit on every worker with
// the same model, so a request that moves between workers (migration, hand-off) has its images
// encoded again from the bytes the router re-sends and computes the same KV.
//
// Thread-safe after Create (the tower is; the rest is immutable): Encode may run concurrently.

#ifndef FERRY_SERVICES_VISION_IMAGE_ENCODER_H_
#define FERRY_SERVICES_VISION_IMAGE_ENCODER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/common/hash128.h"
#include "engine/model/vision/vision_tower.h"
#include "media/image/image.h"
#include "media/image/preprocess.h"

namespace ferry {

class ImageEncoder {
 public:
  // `dir`: the LLaVA directory (its preprocessor_config.json is read here); `tower` its loaded
  // VisionTower (LoadLlavaModel).
  static absl::StatusOr<std::unique_ptr<ImageEncoder>> Create(const std::string& dir,
                                                              VisionTower tower,
                                                              const media::ImageLimits& limits);

  int64_t num_image_tokens() const { return tower_.num_image_tokens(); }
  int64_t hidden_size() const { return tower_.text_hidden_size(); }
  // The tower's digest (VisionTower::digest): embeddings computed elsewhere (ferry-encoder's
  // EmbeddingsInfo.vision_digest) are this encoder's rows only when it is the same.
  const Hash128& vision_digest() const { return tower_.digest(); }

  // The rows for one image: num_image_tokens() x hidden_size() floats.
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> Encode(
      absl::string_view bytes, const Hash128& content_hash, int64_t placeholder_length) const;

 private:
  ImageEncoder(VisionTower tower, media::PreprocessConfig preprocess, media::ImageLimits limits)
      : tower_(std::move(tower)), preprocess_(std::move(preprocess)), limits_(limits) {}

  const VisionTower tower_;
  const media::PreprocessConfig preprocess_;
  const media::ImageLimits limits_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_VISION_IMAGE_ENCODER_H_
