// Mixture-of-experts routing of one token: from its router logits to the experts it goes to and
// their weights, with the options of the MoE families' configs:
//
//   scores  s_e = softmax(logits)_e (Mixtral, Qwen-MoE, DeepSeek-V2; float, the engine's Exp,
//           sums in increasing e) or sigmoid(logits_e) (DeepSeek-V3, scoring_func "sigmoid");
//   choice  c_e = s_e + bias_e (DeepSeek-V3's e_score_correction_bias; 0 without);
//   groups  with num_groups > 1 the experts form num_groups equal groups of consecutive ids; a
//           group's score is its largest c_e (group_score kMax, DeepSeek-V2's
//           group_limited_greedy) or the sum of its two largest (kTopTwoSum, DeepSeek-V3's
//           noaux_tc); only the top_groups best groups (lower group id first among equals) stay;
//   top-k   the experts_per_token largest c_e among the remaining experts, lower id first among
//           equals;
//   weights w = s_e of each chosen expert (the score, never the bias), divided by their sum when
//           norm_topk_prob (plus 1e-20 for sigmoid scores, as DeepSeek-V3 does), times
//           routed_scaling_factor.
//
// Routed experts come out in increasing expert id (the order their outputs are added).

#ifndef FERRY_ENGINE_MODEL_MOE_ROUTING_H_
#define FERRY_ENGINE_MODEL_MOE_ROUTING_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "engine/model/model_config.h"

namespace ferry {

struct RoutedExpert {
  int32_t expert;
  float weight;
};

// Appends the chosen experts of one token (logits: m.num_experts values) to `out`, sorted by
// expert id. `m` must be valid (ModelConfig::Validate).
void RouteToken(const float* logits, const MoeConfig& m, std::vector<RoutedExpert>* out);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_MOE_ROUTING_H_
