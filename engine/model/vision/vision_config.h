// The vision part of a LLaVA-style model's config.json (transformers' LlavaConfig): the CLIP
// vision tower (vision_config), which hidden state feeds the projector (vision_feature_layer,
// vision_feature_select_strategy), the projector's activation and the text model's hidden size
// (the projector's output width), the image placeholder token.
//
// Fields absent from config.json take transformers' defaults (CLIPVisionConfig and LlavaConfig
// 4.47), as transformers itself does: save_pretrained leaves defaults out. Every size is bounded;
// a config outside the bounds, or a tower other than CLIP's (vision_config.model_type
// "clip_vision_model"), is an error naming the path and the field. Plain data; thread-compatible.

#ifndef FERRY_ENGINE_MODEL_VISION_VISION_CONFIG_H_
#define FERRY_ENGINE_MODEL_VISION_VISION_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ferry {

// The activations transformers' ACT2FN names that a CLIP tower or LLaVA projector uses:
// "quick_gelu" (x * sigmoid(1.702 x)), "gelu" (exact, with erf), "gelu_pytorch_tanh" and
// "gelu_new" (the tanh approximation).
enum class VisionActivation { kQuickGelu, kGelu, kGeluTanh };

absl::StatusOr<VisionActivation> ParseVisionActivation(const std::string& name);
const char* VisionActivationName(VisionActivation act);

struct VisionConfig {
  // The tower (vision_config).
  int64_t image_size = 224;
  int64_t patch_size = 32;
  int64_t num_channels = 3;
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_layers = 12;
  int64_t num_heads = 12;
  double layer_norm_eps = 1e-5;
  VisionActivation hidden_act = VisionActivation::kQuickGelu;
  // The LLaVA fields.
  int64_t feature_layer = -2;  // vision_feature_layer: an index into hidden_states (0..L)
  bool keep_cls = false;       // vision_feature_select_strategy "full" (true) or "default"
  VisionActivation projector_act = VisionActivation::kGelu;
  int64_t text_hidden_size = 4096;
  int64_t image_token_index = 32000;

  int64_t patches_per_side() const { return image_size / patch_size; }
  int64_t num_patches() const { return patches_per_side() * patches_per_side(); }
  int64_t num_positions() const { return num_patches() + 1; }  // the CLS token first
  int64_t head_dim() const { return hidden_size / num_heads; }
  // hidden_states index of the features: 0 is the embeddings (after the pre-layernorm), l the
  // output of encoder layer l - 1; a negative feature_layer counts from num_layers + 1.
  int64_t selected_layer() const {
    return feature_layer < 0 ? num_layers + 1 + feature_layer : feature_layer;
  }
  // One embedding row per placeholder token: the patches, and the CLS token for "full".
  int64_t num_image_tokens() const { return num_patches() + (keep_cls ? 1 : 0); }
  // The preprocessed image: num_channels x image_size x image_size floats (CHW).
  int64_t pixel_count() const { return num_channels * image_size * image_size; }
};

// Parses the LLaVA config.json document `j` (read from `path`, for errors).
absl::StatusOr<VisionConfig> ParseVisionConfig(const nlohmann::json& j, const std::string& path);

// Reads DIR/config.json.
absl::StatusOr<VisionConfig> ReadVisionConfig(const std::string& dir);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_VISION_VISION_CONFIG_H_
