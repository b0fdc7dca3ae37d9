#include "engine/model/moe_routing.h"

#include <algorithm>

#include "engine/common/float_math.h"

namespace ferry {

void RouteToken(const float* logits, const MoeConfig& m, std::vector<RoutedExpert>* out) {
  const int64_t n = m.num_experts;
  thread_local std::vector<float> score, choice;
  thread_local std::vector<int32_t> order;
  score.resize(n);
  choice.resize(n);
  if (m.scoring == MoeConfig::Scoring::kSoftmax) {
    float max = logits[0];
    for (int64_t e = 1; e < n; ++e) max = std::max(max, logits[e]);
    float total = 0;
    for (int64_t e = 0; e < n; ++e) total += (score[e] = Exp(logits[e] - max));
    for (int64_t e = 0; e < n; ++e) score[e] = score[e] / total;
  } else {
    for (int64_t e = 0; e < n; ++e) score[e] = 1.0f / (1.0f + Exp(-logits[e]));
  }
  for (int64_t e = 0; e < n; ++e) {
    choice[e] = m.score_bias.empty() ? score[e] : score[e] + m.score_bias[e];
  }
  auto better = [&](int32_t a, int32_t b) {
    return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
  };
  order.clear();
  if (m.num_groups > 1) {
    // Keep the best top_groups groups; choose among their experts.
    const int64_t size = n / m.num_groups;
    std::vector<std::pair<float, int64_t>> groups(m.num_groups);
    for (int64_t g = 0; g < m.num_groups; ++g) {
      std::vector<float> c(choice.begin() + g * size, choice.begin() + (g + 1) * size);
      std::sort(c.begin(), c.end(), std::greater<float>());
      groups[g] = {m.group_score == MoeConfig::GroupScore::kMax ? c[0] : c[0] + c[1], g};
    }
    std::stable_sort(groups.begin(), groups.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (int64_t k = 0; k < m.top_groups; ++k) {
      for (int64_t e = groups[k].second * size; e < (groups[k].second + 1) * size; ++e) {
        order.push_back(static_cast<int32_t>(e));
      }
    }
  } else {
    for (int64_t e = 0; e < n; ++e) order.push_back(static_cast<int32_t>(e));
  }
  const int64_t k = m.experts_per_token;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
  order.resize(k);
  float kept = 0;
  for (int32_t e : order) kept += score[e];
  if (m.scoring == MoeConfig::Scoring::kSigmoid) kept += 1e-20f;
  std::sort(order.begin(), order.end());
  for (int32_t e : order) {
    float w = score[e];
    if (m.norm_topk_prob) w = w / kept;
    if (m.routed_scaling_factor != 1.0) w = w * static_cast<float>(m.routed_scaling_factor);
    out->push_back({e, w});
  }
}

}  // namespace ferry
