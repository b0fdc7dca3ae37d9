// The hyper-parameters of a dense decoder-only transformer (Llama, Qwen2, Qwen3, Mistral
// families), read from an HF config.json or from GGUF metadata.

#ifndef FERRY_ENGINE_MODEL_MODEL_CONFIG_H_
#define FERRY_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace ferry {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", "qwen3", "mistral"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qk_norm = false;         // Qwen3: RMSNorm on q and k per head
  bool attention_bias = false;  // Qwen2: biases on the q, k and v projections

  // Consistency of the numbers (positive sizes, heads dividing evenly); errors name the field.
  absl::Status Validate() const;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_MODEL_CONFIG_H_
