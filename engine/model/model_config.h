// The hyper-parameters of a decoder-only transformer (Llama, Qwen2, Qwen3, Mistral families, and
// the mixture-of-experts Mixtral and Qwen2-MoE), read from an HF config.json or GGUF metadata.

#ifndef FERRY_ENGINE_MODEL_MODEL_CONFIG_H_
#define FERRY_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/common/token_id.h"

namespace ferry {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// A mixture-of-experts FFN (num_experts > 0). Per token: router logits = h W_router, routed as
// engine/model/moe_routing.h defines (softmax or sigmoid scores, top-k, optional group limit,
// renormalisation and scaling); the chosen experts' SwiGLU outputs times their weights are added
// in increasing expert id; a shared expert (shared_intermediate_size > 0) is added last, scaled
// by sigmoid(h w_gate) when shared_expert_gate (Qwen2-MoE).
struct MoeConfig {
  enum class Scoring { kSoftmax, kSigmoid };
  enum class GroupScore { kMax, kTopTwoSum };
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_intermediate_size = 0;
  int64_t shared_intermediate_size = 0;
  bool shared_expert_gate = false;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  // DeepSeek-style options (engine/model/moe_routing.h): sigmoid scores, a per-expert bias used
  // for the choice only, group-limited choice.
  Scoring scoring = Scoring::kSoftmax;
  std::vector<float> score_bias;  // empty, or one per expert (per model, not per layer)
  int64_t num_groups = 1;
  int64_t top_groups = 1;
  GroupScore group_score = GroupScore::kMax;
  std::vector<bool> dense_layers;  // per layer: a dense FFN (intermediate_size) instead
  bool sparse(int64_t layer) const {
    return num_experts > 0 &&
           !(layer < static_cast<int64_t>(dense_layers.size()) && dense_layers[layer]);
  }
};

struct ModelConfig {
  std::string architecture;  // "llama", "qwen2", "qwen3", "mistral", "mixtral", "qwen2_moe"
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
  MoeConfig moe;
  // Per layer: the sliding attention window (a position sees itself and the window - 1 before
  // it), or 0 for full attention. Empty: every layer full.
  std::vector<int32_t> sliding_windows;
  int32_t window(int64_t layer) const {
    return layer < static_cast<int64_t>(sliding_windows.size()) ? sliding_windows[layer] : 0;
  }

  // The tokens that end a generation (the model's end-of-sequence ids: config.json's and
  // generation_config.json's eos_token_id, or GGUF's eos/eot/eom ids). The engine stops on them
  // unless a request sets ignore_eos.
  std::vector<TokenId> eos_token_ids;
  // Consistency of the numbers (positive sizes, heads dividing evenly); errors name the field.
  absl::Status Validate() const;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_MODEL_CONFIG_H_
