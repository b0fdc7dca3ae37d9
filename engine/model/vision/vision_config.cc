#include "engine/model/vision/vision_config.h"

#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

using Json = nlohmann::json;

// Reads integer `key` of `j` into `out` (absent or null: unchanged) and checks lo <= it <= hi.
absl::Status GetInt(const Json& j, const char* key, int64_t lo, int64_t hi,
                    const std::string& where, int64_t* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  if (!j[key].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(where, key, " is not an integer"));
  }
  const int64_t v = j[key].get<int64_t>();
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, " = ", v, " is outside [", lo, ", ", hi, "]"));
  }
  *out = v;
  return absl::OkStatus();
}

absl::Status GetActivation(const Json& j, const char* key, const std::string& where,
                           VisionActivation* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  if (!j[key].is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, key, " is not a string"));
  }
  auto act = ParseVisionActivation(j[key].get<std::string>());
  if (!act.ok())
    return absl::Status(act.status().code(),
                        absl::StrCat(where, key, ": ", act.status().message()));
  *out = *act;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VisionActivation> ParseVisionActivation(const std::string& name) {
  if (name == "quick_gelu") return VisionActivation::kQuickGelu;
  if (name == "gelu") return VisionActivation::kGelu;
  if (name == "gelu_pytorch_tanh" || name == "gelu_new") return VisionActivation::kGeluTanh;
  return absl::UnimplementedError(absl::StrCat(
      "activation '", name, "' is not supported (quick_gelu, gelu, gelu_pytorch_tanh, gelu_new)"));
}

const char* VisionActivationName(VisionActivation act) {
  switch (act) {
    case VisionActivation::kQuickGelu:
      return "quick_gelu";
    case VisionActivation::kGelu:
      return "gelu";
    case VisionActivation::kGeluTanh:
      return "gelu_pytorch_tanh";
  }
  return "?";
}

absl::StatusOr<VisionConfig> ParseVisionConfig(const Json& j, const std::string& path) {
  VisionConfig c;
  const std::string top = path + ": ";
  if (!j.is_object()) return absl::InvalidArgumentError(top + "not a JSON object");
  if (j.value("model_type", std::string()) != "llava") {
    return absl::UnimplementedError(
        absl::StrCat(top, "model_type '", j.value("model_type", std::string()),
                     "' is not a vision-language model Ferry runs (llava)"));
  }
  if (!j.contains("vision_config") || !j["vision_config"].is_object()) {
    return absl::InvalidArgumentError(top + "no vision_config object");
  }
  const Json& v = j["vision_config"];
  const std::string vw = path + ": vision_config.";
  const std::string type = v.value("model_type", std::string("clip_vision_model"));
  if (type != "clip_vision_model") {
    return absl::UnimplementedError(
        absl::StrCat(vw, "model_type '", type, "' is not supported (clip_vision_model)"));
  }
  RETURN_IF_ERROR(GetInt(v, "image_size", 1, 4096, vw, &c.image_size));
  RETURN_IF_ERROR(GetInt(v, "patch_size", 1, 4096, vw, &c.patch_size));
  RETURN_IF_ERROR(GetInt(v, "num_channels", 3, 3, vw, &c.num_channels));
  RETURN_IF_ERROR(GetInt(v, "hidden_size", 1, 16384, vw, &c.hidden_size));
  RETURN_IF_ERROR(GetInt(v, "intermediate_size", 1, 65536, vw, &c.intermediate_size));
  RETURN_IF_ERROR(GetInt(v, "num_hidden_layers", 1, 256, vw, &c.num_layers));
  RETURN_IF_ERROR(GetInt(v, "num_attention_heads", 1, 1024, vw, &c.num_heads));
  if (v.contains("layer_norm_eps") && !v["layer_norm_eps"].is_null()) {
    if (!v["layer_norm_eps"].is_number() || !(v["layer_norm_eps"].get<double>() > 0) ||
        v["layer_norm_eps"].get<double>() > 1) {
      return absl::InvalidArgumentError(vw + "layer_norm_eps must be a number in (0, 1]");
    }
    c.layer_norm_eps = v["layer_norm_eps"].get<double>();
  }
  RETURN_IF_ERROR(GetActivation(v, "hidden_act", vw, &c.hidden_act));
  if (c.image_size % c.patch_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        vw, "image_size ", c.image_size, " is not a multiple of patch_size ", c.patch_size));
  }
  if (c.hidden_size % c.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(vw, "hidden_size ", c.hidden_size,
                                                   " is not a multiple of num_attention_heads ",
                                                   c.num_heads));
  }
  if (c.num_patches() > 16384) {
    return absl::InvalidArgumentError(
        absl::StrCat(vw, c.num_patches(), " patches per image (at most 16384)"));
  }

  if (j.contains("vision_feature_layer") && !j["vision_feature_layer"].is_number_integer() &&
      !j["vision_feature_layer"].is_null()) {
    return absl::UnimplementedError(
        top + "vision_feature_layer must be one integer (lists of layers are not supported)");
  }
  RETURN_IF_ERROR(
      GetInt(j, "vision_feature_layer", -(c.num_layers + 1), c.num_layers, top, &c.feature_layer));
  const std::string strategy = j.value("vision_feature_select_strategy", std::string("default"));
  if (strategy != "default" && strategy != "full") {
    return absl::InvalidArgumentError(absl::StrCat(top, "vision_feature_select_strategy '",
                                                   strategy, "' (expected default or full)"));
  }
  c.keep_cls = strategy == "full";
  RETURN_IF_ERROR(GetActivation(j, "projector_hidden_act", top, &c.projector_act));
  RETURN_IF_ERROR(
      GetInt(j, "image_token_index", 0, int64_t{0xFFFFFFFF}, top, &c.image_token_index));
  if (j.contains("text_config") && j["text_config"].is_object()) {
    RETURN_IF_ERROR(GetInt(j["text_config"], "hidden_size", 1, 65536, path + ": text_config.",
                           &c.text_hidden_size));
  }
  return c;
}

absl::StatusOr<VisionConfig> ReadVisionConfig(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  Json j;
  try {
    j = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  return ParseVisionConfig(j, path);
}

}  // namespace ferry
