#include "engine/model/vision/llava_model.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"

namespace ferry {

absl::StatusOr<LlavaModel> LoadLlavaModel(const std::string& dir, WeightDType dtype,
                                          const std::string& kv_dtype) {
  ASSIGN_OR_RETURN(HostWeights text, LoadHfModel(dir, dtype, kv_dtype));
  // The tower computes as the text model does: fp32 products for f32 weights, bf16 products
  // (fp32 accumulation) otherwise.
  const VisionPrecision precision =
      dtype == WeightDType::kF32 ? VisionPrecision::kF32 : VisionPrecision::kBf16;
  ASSIGN_OR_RETURN(VisionTower tower, VisionTower::Load(dir, precision));
  if (tower.text_hidden_size() != text.config.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": the projector gives rows of ", tower.text_hidden_size(),
                     " floats, the text model's hidden size is ", text.config.hidden_size));
  }
  const int64_t image_token = tower.config().image_token_index;
  if (image_token < 0 || image_token >= text.config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": image_token_index ", image_token,
                                                   " is outside the vocabulary (",
                                                   text.config.vocab_size, ")"));
  }
  text.fingerprint = ExtendModelFingerprint(text.fingerprint, tower.digest());
  return LlavaModel{std::move(text), std::move(tower)};
}

}  // namespace ferry
