// Small random models of each dense-family feature (GQA, q/k/v biases, q/k norm with head_dim !=
// hidden/heads, tied embeddings), fp32 or bf16 weights, fp32 or bf16 KV: for tests of properties
// that do not depend on trained weights (determinism across batching, chunking, caching), also
// with block-format (native) weights.

#ifndef FERRY_ENGINE_MODEL_SYNTHETIC_MODEL_H_
#define FERRY_ENGINE_MODEL_SYNTHETIC_MODEL_H_

#include <cstdint>
#include <string>

#include "engine/model/host_weights.h"

namespace ferry {

struct SyntheticVariant {
  std::string name;
  bool bias = false;
  bool qk_norm = false;
  bool tied = false;
  int64_t head_dim = 8;
  WeightDType weights = WeightDType::kF32;
  std::string kv = "f32";
  // Mixture of experts in layer 1 (layer 0 stays dense): experts, top-k, a gated shared expert.
  int64_t experts = 0;
  int64_t experts_per_token = 2;
  bool shared_expert = false;
  // A sliding window on the even layers (0, 2, ...; the odd ones attend to everything): a hybrid
  // model.
  int32_t window = 0;
  int64_t layers = 2;  // dense models only
  // Block-format weights as a GGUF file of SmolLM2 holds them: the embedding (tied or not) in
  // Q8_0, every other matrix in Q4_1 (quantized here as GGML's reference quantizer does) except
  // down_proj in Q6_K (a K-quant: the MLP is 256 wide for it), vectors f32. Dense models only.
  bool native = false;
  // Every matrix in one block format, Q8_0 or Q4_K, vectors f32; kNone: as above. Dense models
  // only. Every matrix's rows must be whole blocks (32 values, Q4_K 256): hidden, intermediate and
  // heads x head_dim multiples of that (checked).
  WeightQuant all_blocks = WeightQuant::kNone;
  // Other shapes than the tiny default (a model-shaped GPU check: SmolLM2's, Llama-3-8B's); 0:
  // the default. Weights scale by sqrt(32 / hidden) so activations stay of the same size.
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t vocab = 0;
  int64_t max_positions = 0;
  uint32_t seed = 1234;
};

// By default vocabulary 97, hidden 32, `layers` layers (2), 4 heads over 2 KV heads, 512
// positions, seed 1234 (the shape fields and `seed` above change them). With experts > 0, a
// Qwen2-MoE-style model of 2 layers whose layer 1 is sparse (experts of width 24).
HostWeights SyntheticModel(const SyntheticVariant& v);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_SYNTHETIC_MODEL_H_
