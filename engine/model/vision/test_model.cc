#include "engine/model/vision/test_model.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ferry {
namespace testing_model {

using Json = nlohmann::json;

// image 4 px, patch 2 (4 patches), hidden 4, 2 heads, 2 layers, text hidden 6.
Json Config() {
  return Json::parse(R"({
    "model_type": "llava", "image_token_index": 9, "projector_hidden_act": "gelu",
    "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
    "text_config": {"model_type": "llama", "hidden_size": 6},
    "vision_config": {"model_type": "clip_vision_model", "image_size": 4, "patch_size": 2,
                      "hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2,
                      "num_attention_heads": 2}})");
}

std::vector<float> Values(int64_t n, int seed) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * static_cast<float>(i + 7 * seed)) * 0.8f;
  return v;
}

Tensors Weights() {
  Tensors t;
  int seed = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    t[name] = {shape, Values(n, ++seed)};
  };
  const std::string v = "vision_tower.vision_model.";
  add(v + "embeddings.class_embedding", {4});
  add(v + "embeddings.patch_embedding.weight", {4, 3, 2, 2});
  add(v + "embeddings.position_embedding.weight", {5, 4});
  for (const char* n : {"pre_layrnorm", "post_layernorm"}) {
    add(v + n + ".weight", {4});
    add(v + n + ".bias", {4});
  }
  for (int l = 0; l < 2; ++l) {
    const std::string p = absl::StrCat(v, "encoder.layers.", l, ".");
    for (const char* n : {"layer_norm1", "layer_norm2"}) {
      add(p + n + ".weight", {4});
      add(p + n + ".bias", {4});
    }
    for (const char* n : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      add(p + "self_attn." + n + ".weight", {4, 4});
      add(p + "self_attn." + n + ".bias", {4});
    }
    add(p + "mlp.fc1.weight", {8, 4});
    add(p + "mlp.fc1.bias", {8});
    add(p + "mlp.fc2.weight", {4, 8});
    add(p + "mlp.fc2.bias", {4});
  }
  add("multi_modal_projector.linear_1.weight", {6, 4});
  add("multi_modal_projector.linear_1.bias", {6});
  add("multi_modal_projector.linear_2.weight", {6, 6});
  add("multi_modal_projector.linear_2.bias", {6});
  add("language_model.model.embed_tokens.weight", {10, 6});
  return t;
}

// Writes DIR (a fresh directory under the test's temp dir) with config.json and the tensors.
std::string WriteModel(const std::string& name, const Json& config, const Tensors& tensors) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name);
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/config.json") << config.dump();
  Json header = Json::object();
  std::string data;
  for (const auto& [n, t] : tensors) {
    const size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(t.second.data()), t.second.size() * sizeof(float));
    header[n] = {{"dtype", "F32"}, {"shape", t.first}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string h = header.dump();
  const uint64_t size = h.size();
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  out.write(reinterpret_cast<const char*>(&size), 8);
  out << h << data;
  return dir;
}

}  // namespace testing_model
}  // namespace ferry
