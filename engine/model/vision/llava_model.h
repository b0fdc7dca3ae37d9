// A LLaVA-style vision-language model loaded from an HF directory: the text model (LoadHfModel's
// HostWeights, from text_config and the language_model.* tensors) and the VisionTower (tower and
// projector), with the text model's fingerprint extended by the tower's digest
// (ExtendModelFingerprint, engine/common/model_fingerprint.h), so that KV computed from one
// tower's embeddings never matches another's. This is where a vision-language model's
// fingerprint is computed; LoadHfModel alone gives the text model's. The tower's arithmetic
// follows the text model's weight type: WeightDType::kF32 gives VisionPrecision::kF32 (the exact
// path), bf16 and native give kBf16 (bf16 products with fp32 accumulation, about twice the
// rate; the digest tells them apart, so their KV never mixes).
//
// Errors: those of LoadHfModel and VisionTower::Load, and InvalidArgument when the tower's
// output width is not the text model's hidden size or its image token is outside the
// vocabulary. Plain values after Load; the tower is thread-safe (vision_tower.h).

#ifndef FERRY_ENGINE_MODEL_VISION_LLAVA_MODEL_H_
#define FERRY_ENGINE_MODEL_VISION_LLAVA_MODEL_H_

#include <string>

#include "absl/status/statusor.h"
#include "engine/model/host_weights.h"
#include "engine/model/vision/vision_tower.h"

namespace ferry {

struct LlavaModel {
  HostWeights text;  // text.fingerprint covers the tower and projector too
  VisionTower tower;
};

absl::StatusOr<LlavaModel> LoadLlavaModel(const std::string& dir, WeightDType dtype,
                                          const std::string& kv_dtype = "bf16");

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_VISION_LLAVA_MODEL_H_
