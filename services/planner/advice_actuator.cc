#include "services/planner/advice_actuator.h"

#include "absl/strings/str_cat.h"

namespace ferry {

absl::StatusOr<PoolReplicas> AdviceActuator::Replicas(PoolRole, absl::Time) {
  return PoolReplicas{};  // spec -1: the routers' list counts
}

absl::Status AdviceActuator::Scale(PoolRole pool, int64_t replicas,
                                   const std::vector<WorkerSample>&, absl::Time) {
  if (replicas < 0) {
    return absl::InvalidArgumentError(absl::StrCat("replicas must be >= 0, not ", replicas));
  }
  advice_[static_cast<int>(pool)] = replicas;
  return absl::OkStatus();
}

}  // namespace ferry
