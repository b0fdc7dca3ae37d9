// A hand-written LLaVA directory for unit tests (a 4-px CLIP tower of 2 layers with a 2-layer
// projector, tensors from a fixed formula), so that loading, errors and determinism can be tested
// without transformers; the numbers themselves are checked against transformers elsewhere
// (vision_reference_test, llava_reference_test). Plain functions; each call writes files.

#ifndef FERRY_ENGINE_MODEL_VISION_TEST_MODEL_H_
#define FERRY_ENGINE_MODEL_VISION_TEST_MODEL_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace ferry {
namespace testing_model {

using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

// config.json: image 4 px, patch 2 (4 patches), hidden 4, 2 heads, 2 layers, text hidden 6, image
// token 9.
nlohmann::json Config();
// `n` values in [-0.8, 0.8] from `seed`.
std::vector<float> Values(int64_t n, int seed);
// Every tower and projector tensor Config() needs (F32), and a text embedding table.
Tensors Weights();
// Writes a fresh directory under the test's temp dir, named `name`, with config.json and the
// tensors as model.safetensors; returns its path.
std::string WriteModel(const std::string& name, const nlohmann::json& config,
                       const Tensors& tensors);

}  // namespace testing_model
}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_VISION_TEST_MODEL_H_
