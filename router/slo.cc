#include "router/slo.h"

namespace ferry {

SloJudgement JudgeSlo(const SloRecord& r, const SloObjectives& o) {
  SloJudgement j;
  if (!r.dispatched) return j;
  if (r.first_token) {
    j.ttft = r.ttft_seconds <= absl::ToDoubleSeconds(o.ttft) ? SloResult::kMet : SloResult::kMissed;
  } else if (r.failed) {
    j.ttft = SloResult::kMissed;
  }
  if (r.first_token && r.tokens_after_first > 0) {
    const double mean = r.decode_seconds / static_cast<double>(r.tokens_after_first);
    j.itl = mean <= absl::ToDoubleSeconds(o.itl) ? SloResult::kMet : SloResult::kMissed;
  }
  return j;
}

}  // namespace ferry
