#include "engine/model/model_config.h"

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status ModelConfig::Validate() const {
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_layers},
      {"num_attention_heads", num_heads},
      {"num_key_value_heads", num_kv_heads},
      {"head_dim", head_dim},
  };
  for (const auto& [name, value] : positive) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", name, " is ", value, ", must be positive"));
    }
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", num_heads,
                                                   " attention heads are not a multiple of ",
                                                   num_kv_heads, " key/value heads"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_dim ", head_dim, " is odd (RoPE rotates pairs)"));
  }
  if (moe.num_experts > 0) {
    if (moe.experts_per_token < 1 || moe.experts_per_token > moe.num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("model config: ", moe.experts_per_token,
                                                     " experts per token of ", moe.num_experts));
    }
    if (moe.expert_intermediate_size <= 0 || moe.shared_intermediate_size < 0) {
      return absl::InvalidArgumentError("model config: expert sizes must be positive");
    }
    if (!(moe.routed_scaling_factor > 0)) {
      return absl::InvalidArgumentError("model config: routed_scaling_factor must be positive");
    }
    if (!moe.score_bias.empty() && static_cast<int64_t>(moe.score_bias.size()) != moe.num_experts) {
      return absl::InvalidArgumentError("model config: one score bias per expert");
    }
    if (moe.num_groups < 1 || moe.num_experts % moe.num_groups != 0 || moe.top_groups < 1 ||
        moe.top_groups > moe.num_groups ||
        moe.experts_per_token > moe.top_groups * (moe.num_experts / moe.num_groups)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", moe.num_experts, " experts in ", moe.num_groups, " groups, ",
          moe.top_groups, " kept, cannot give ", moe.experts_per_token, " experts per token"));
    }
    if (moe.group_score == MoeConfig::GroupScore::kTopTwoSum && moe.num_groups > 1 &&
        moe.num_experts / moe.num_groups < 2) {
      return absl::InvalidArgumentError(
          "model config: top-two group scores need 2+ experts a group");
    }
  }
  if (!sliding_windows.empty() && static_cast<int64_t>(sliding_windows.size()) != num_layers) {
    return absl::InvalidArgumentError("model config: one sliding window per layer");
  }
  for (int32_t w : sliding_windows) {
    if (w < 0) return absl::InvalidArgumentError("model config: negative sliding window");
  }
  for (TokenId t : eos_token_ids) {
    if (t >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: eos token ", t, " is outside the vocabulary (", vocab_size, ")"));
    }
  }
  if (!(rope_theta > 0) || !(rms_norm_eps > 0)) {
    return absl::InvalidArgumentError("model config: rope_theta and rms_norm_eps must be positive");
  }
  return absl::OkStatus();
}

}  // namespace ferry
