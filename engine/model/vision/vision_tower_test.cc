// VisionTower on hand-written LLaVA directories: loading, shapes, errors, determinism and the
// digest (the numbers themselves are checked against transformers by vision_reference_test).

#include "engine/model/vision/vision_tower.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/cpu/cpu_kernels.h"
#include "engine/common/model_fingerprint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::json;
using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

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

TEST(VisionTowerTest, LoadsAndEncodesDeterministically) {
  auto tower = VisionTower::Load(WriteModel("ok", Config(), Weights()));
  ASSERT_TRUE(tower.ok()) << tower.status();
  EXPECT_EQ(tower->image_size(), 4);
  EXPECT_EQ(tower->num_image_tokens(), 4);  // 2x2 patches, CLS dropped
  EXPECT_EQ(tower->text_hidden_size(), 6);
  EXPECT_EQ(tower->config().selected_layer(), 1);
  EXPECT_EQ(tower->config().image_token_index, 9);
  const std::vector<float> pixels = Values(3 * 4 * 4, 99);
  auto a = tower->Encode(pixels);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->size(), 4u * 6u);
  for (float x : *a) EXPECT_TRUE(std::isfinite(x));
  auto b = tower->Encode(pixels);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);
  // Encode = the projector over hidden_states[1] without its CLS row.
  auto hidden = tower->HiddenState(pixels, 1);
  ASSERT_TRUE(hidden.ok());
  ASSERT_EQ(hidden->size(), 5u * 4u);
  hidden->erase(hidden->begin(), hidden->begin() + 4);
  EXPECT_EQ(tower->Project(*hidden, 4), *a);
}

TEST(VisionTowerTest, EveryInstructionSetGivesTheSameBits) {
  const std::string dir = WriteModel("isa", Config(), Weights());
  const std::vector<float> pixels = Values(3 * 4 * 4, 5);
  for (VisionPrecision precision : {VisionPrecision::kF32, VisionPrecision::kBf16}) {
    std::vector<float> first;
    for (CpuIsa isa : SupportedCpuIsas()) {
      setenv("FERRY_CPU_ISA", CpuIsaName(isa), 1);
      auto tower = VisionTower::Load(dir, precision);
      ASSERT_TRUE(tower.ok()) << tower.status();
      auto e = tower->Encode(pixels);
      ASSERT_TRUE(e.ok());
      if (first.empty()) first = *e;
      EXPECT_EQ(std::memcmp(first.data(), e->data(), first.size() * sizeof(float)), 0)
          << CpuIsaName(isa) << (precision == VisionPrecision::kBf16 ? " bf16" : " f32");
    }
  }
  unsetenv("FERRY_CPU_ISA");
}

// The bf16 variant: deterministic, its own digest, and not the fp32 numbers (its distance from
// transformers' fp32 outputs is vision_reference_test's).
TEST(VisionTowerTest, Bf16VariantIsDeterministicWithItsOwnDigest) {
  const std::string dir = WriteModel("bf16", Config(), Weights());
  auto f32 = VisionTower::Load(dir);
  auto bf16 = VisionTower::Load(dir, VisionPrecision::kBf16);
  ASSERT_TRUE(f32.ok() && bf16.ok());
  EXPECT_EQ(f32->precision(), VisionPrecision::kF32);
  EXPECT_EQ(bf16->precision(), VisionPrecision::kBf16);
  EXPECT_NE(f32->digest(), bf16->digest());
  const std::vector<float> pixels = Values(3 * 4 * 4, 11);
  auto a = bf16->Encode(pixels);
  auto b = bf16->Encode(pixels);
  auto c = f32->Encode(pixels);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  for (float x : *a) EXPECT_TRUE(std::isfinite(x));
}

TEST(VisionTowerTest, FullStrategyKeepsTheClsRow) {
  Json config = Config();
  config["vision_feature_select_strategy"] = "full";
  auto tower = VisionTower::Load(WriteModel("full", config, Weights()));
  ASSERT_TRUE(tower.ok()) << tower.status();
  EXPECT_EQ(tower->num_image_tokens(), 5);
  auto e = tower->Encode(Values(48, 1));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->size(), 5u * 6u);
}

TEST(VisionTowerTest, BadInputIsAnError) {
  auto tower = VisionTower::Load(WriteModel("ok2", Config(), Weights()));
  ASSERT_TRUE(tower.ok()) << tower.status();
  EXPECT_EQ(tower->Encode(std::vector<float>(47)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(tower->HiddenState(std::vector<float>(48), 3).ok());
}

TEST(VisionTowerTest, BadDirectoriesAreErrors) {
  EXPECT_FALSE(VisionTower::Load(::testing::TempDir() + "/nonexistent").ok());
  Tensors missing = Weights();
  missing.erase("multi_modal_projector.linear_2.bias");
  auto s = VisionTower::Load(WriteModel("missing", Config(), missing)).status();
  EXPECT_NE(s.message().find("missing tensor multi_modal_projector.linear_2.bias"),
            std::string::npos)
      << s;
  Tensors shape = Weights();
  shape["vision_tower.vision_model.pre_layrnorm.bias"].first = {5};
  shape["vision_tower.vision_model.pre_layrnorm.bias"].second.push_back(0);
  s = VisionTower::Load(WriteModel("shape", Config(), shape)).status();
  EXPECT_NE(s.message().find("has shape [5]"), std::string::npos) << s;
  Tensors extra = Weights();
  extra["vision_tower.vision_model.encoder.layers.7.mlp.fc1.bias"] = {{8}, Values(8, 3)};
  s = VisionTower::Load(WriteModel("extra", Config(), extra)).status();
  EXPECT_NE(s.message().find("unexpected tensor"), std::string::npos) << s;
  Tensors truncated = Weights();  // the header's shape holds more than the data
  truncated["multi_modal_projector.linear_1.bias"].second.pop_back();
  EXPECT_FALSE(VisionTower::Load(WriteModel("truncated", Config(), truncated)).ok());
  Json siglip = Config();
  siglip["vision_config"]["model_type"] = "siglip_vision_model";
  EXPECT_EQ(VisionTower::Load(WriteModel("siglip", siglip, Weights())).status().code(),
            absl::StatusCode::kUnimplemented);
  Json odd = Config();
  odd["vision_config"]["image_size"] = 5;
  s = VisionTower::Load(WriteModel("odd", odd, Weights())).status();
  EXPECT_NE(s.message().find("not a multiple of patch_size"), std::string::npos) << s;
  Json layer = Config();
  layer["vision_feature_layer"] = -4;
  EXPECT_FALSE(VisionTower::Load(WriteModel("layer", layer, Weights())).ok());
  Json text = Config();
  text["model_type"] = "llama";
  EXPECT_EQ(VisionTower::Load(WriteModel("text", text, Weights())).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(VisionTowerTest, DigestCoversTowerAndProjectorWeights) {
  auto base = VisionTower::Load(WriteModel("d0", Config(), Weights()));
  ASSERT_TRUE(base.ok()) << base.status();
  const Hash128 text_fp = Xxh3Hash128("text model fingerprint");
  const Hash128 fp = ExtendModelFingerprint(text_fp, base->digest());
  int i = 0;
  for (const char* name : {"vision_tower.vision_model.encoder.layers.1.mlp.fc2.weight",
                           "vision_tower.vision_model.embeddings.class_embedding",
                           "multi_modal_projector.linear_1.bias"}) {
    Tensors changed = Weights();
    changed[name].second[0] += 1e-3f;
    auto tower = VisionTower::Load(WriteModel(absl::StrCat("d", ++i), Config(), changed));
    ASSERT_TRUE(tower.ok()) << tower.status();
    EXPECT_NE(tower->digest(), base->digest()) << name;
    EXPECT_NE(ExtendModelFingerprint(text_fp, tower->digest()), fp) << name;
  }
  // The text model's tensors are not the tower's: its own fingerprint covers them.
  Tensors text = Weights();
  text["language_model.model.embed_tokens.weight"].second[0] += 1.0f;
  auto tower = VisionTower::Load(WriteModel("dtext", Config(), text));
  ASSERT_TRUE(tower.ok());
  EXPECT_EQ(tower->digest(), base->digest());
  // The configuration counts too: "full" changes what the projector sees.
  Json full = Config();
  full["vision_feature_select_strategy"] = "full";
  tower = VisionTower::Load(WriteModel("dfull", full, Weights()));
  ASSERT_TRUE(tower.ok());
  EXPECT_NE(tower->digest(), base->digest());
}

}  // namespace
}  // namespace ferry
