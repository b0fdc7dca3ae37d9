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
#include "engine/model/vision/test_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::json;
using testing_model::Config;
using testing_model::Tensors;
using testing_model::Values;
using testing_model::Weights;
using testing_model::WriteModel;

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
