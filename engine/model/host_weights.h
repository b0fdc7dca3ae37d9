// A loaded model in host memory: its configuration, its tensors under their HF names in HF
// layout ([out, in] for projections) converted to the engine's weight type, and its fingerprint.
// Backends take their weights from here.
//
// Weight types (the load's choice): f32 or bf16 convert every tensor; native keeps each matrix
// stored in a block format the engine computes on (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K) as the file's blocks (a GGUF expert tensor's slice per expert), keeps F32 matrices f32
// (MoE routers, which llama.cpp leaves F32), converts other matrices to bf16 and vectors (norms,
// biases) to f32. Safetensors files have no block formats: native loads them as bf16.

#ifndef FERRY_ENGINE_MODEL_HOST_WEIGHTS_H_
#define FERRY_ENGINE_MODEL_HOST_WEIGHTS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/backend.h"
#include "engine/common/hash128.h"
#include "engine/model/model_config.h"

namespace ferry {

// kNative is a load choice only; a tensor's own dtype is kF32 or kBF16 (or it holds blocks).
enum class WeightDType { kF32, kBF16, kNative };

// "f32", "bf16", "native"; ParseWeightDType takes the same names.
const char* WeightDTypeName(WeightDType dtype);
absl::StatusOr<WeightDType> ParseWeightDType(const std::string& name);

struct HostTensor {
  std::vector<int64_t> shape;  // row-major, HF order
  WeightDType dtype = WeightDType::kF32;
  std::vector<float> f32;      // when dtype == kF32 and quant == kNone
  std::vector<uint16_t> bf16;  // when dtype == kBF16 and quant == kNone
  // A matrix kept in a block format: shape[0] rows of shape[1] / 32 (K-quants: / 256) GGML
  // blocks each.
  WeightQuant quant = WeightQuant::kNone;
  std::vector<uint8_t> blocks;

  int64_t elements() const;
};

struct HostWeights {
  ModelConfig config;
  std::map<std::string, HostTensor> tensors;
  Hash128 fingerprint;
  std::string kv_dtype;  // the KV cache type the fingerprint was computed for: "f32" or "bf16"
  // What the fingerprint calls the weights: "f32", "bf16", or "native:" and the matrices' formats
  // ("native:q4_1,q8_0"; bf16 when some matrix was converted). With the file's digest in the
  // fingerprint too, it fixes the arithmetic (which stacked matrices, mixing a block format with
  // f32 or bf16 parts, are computed in bf16 included).
  std::string weight_dtype;
  double load_seconds = 0;
  uint64_t source_bytes = 0;  // bytes read from the model files
};

class GgufFile;
class ModelFingerprintBuilder;

namespace model_internal {

// The last step of every loader: adds the KV layout (with `kv_dtype`) and the weight dtype to
// `fingerprint` (which already holds the files and the tokenizer digest), finishes it into
// weights->fingerprint, and records the load time since `start_seconds` (steady clock).
absl::Status FinishLoad(ModelFingerprintBuilder& fingerprint, const std::string& kv_dtype,
                        WeightDType dtype, double start_seconds, HostWeights* weights);

// Steady-clock seconds, for FinishLoad's start.
double SteadySeconds();

// [HF name -> shape] of every tensor a model of config `c` has (lm_head only when its
// embeddings are not tied): what every loader must find, each exactly once.
std::map<std::string, std::vector<int64_t>> ExpectedTensors(const ModelConfig& c);

// One tensor for ConvertTensors: `size` bytes of GGML `type` at `data` (which must stay mapped
// until ConvertTensors returns) into `out`, whose shape and dtype are set; rows un-permuted
// afterwards when `permute_heads` > 0 (llama.cpp stores q/k rows of head h as (h, j, t) for HF's
// (h, t, j), t in {0, 1}, j < head_dim / 2).
struct ConversionJob {
  std::string source;  // "file: tensor 'name'", for errors
  uint32_t type = 0;
  const uint8_t* data = nullptr;
  size_t size = 0;
  HostTensor* out = nullptr;
  int64_t permute_heads = 0;
};

// Checks every job, then converts them all as one parallel loop on the shared thread pool: each
// tensor is cut into ranges of whole blocks (about 256K elements), and the ranges of all tensors
// are spread over the threads together, so small tensors never run one at a time and a large one
// never runs on one thread.
absl::Status ConvertTensors(const std::vector<ConversionJob>& jobs);

}  // namespace model_internal

// Loads a llama-architecture GGUF model (SmolLM2, Llama, Mistral-style) into `dtype`. Undoes
// llama.cpp's Q/K row permutation so that tensors are in HF layout; checks every expected tensor
// is present with its shape and no unexpected one is; computes the fingerprint with `kv_dtype`
// ("f32" or "bf16") as the KV cache type.
// Loads an HF model directory: config.json (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe,
// qwen3_moe), model.safetensors or the shards of model.safetensors.index.json (F32, F16, BF16),
// and tokenizer.json (for the fingerprint). Every tensor the config calls for must be present with
// its shape; an unexpected one is an error.
// A LLaVA directory (model_type "llava") loads as its text model: text_config (a llama or mistral,
// with transformers' defaults for the fields save_pretrained leaves out), the language_model.*
// tensors under their text-model names; vision_tower.* and multi_modal_projector.* are skipped
// (the VisionTower loads them). The fingerprint is then the text model's (its files' digests
// cover the tower's bytes too); LoadLlavaModel (engine/model/vision/llava_model.h) extends it
// with the tower's digest, as a vision-language model's must be.
absl::StatusOr<HostWeights> LoadHfModel(const std::string& dir, WeightDType dtype,
                                        const std::string& kv_dtype = "bf16");

absl::StatusOr<HostWeights> LoadGgufModel(const GgufFile& gguf, WeightDType dtype,
                                          const std::string& kv_dtype = "bf16");

// The configuration alone, without the weights (what LoadHfModel / LoadGgufModel put in
// HostWeights::config): for services that need the model's shape, positions and end-of-sequence
// ids without its tensors (the null engine).
absl::StatusOr<ModelConfig> ReadHfModelConfig(const std::string& dir);
absl::StatusOr<ModelConfig> ReadGgufModelConfig(const GgufFile& gguf);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_HOST_WEIGHTS_H_
