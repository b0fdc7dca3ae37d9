// The advice actuator (actuator.h): changes nothing. The planner still decides every interval and
// exports its decisions (ferry_planner_desired_replicas{pool}, GET /plan), for an operator or for
// an HPA that scales the pool on that external metric. Use either the planner's own actuation or
// an HPA on a pool, never both (docs/operations/planner.md).
//
//   Replicas(pool)  spec -1 (not known here: the planner counts the workers the routers list),
//                   nothing changing.
//   Scale(pool, n)  records n as the pool's advice and returns OK.
//
// Thread-compatible (actuator.h).

#ifndef FERRY_SERVICES_PLANNER_ADVICE_ACTUATOR_H_
#define FERRY_SERVICES_PLANNER_ADVICE_ACTUATOR_H_

#include <array>
#include <cstdint>
#include <vector>

#include "services/planner/actuator.h"

namespace ferry {

class AdviceActuator final : public Actuator {
 public:
  const char* name() const override { return "advice"; }
  absl::StatusOr<PoolReplicas> Replicas(PoolRole pool, absl::Time deadline) override;
  absl::Status Scale(PoolRole pool, int64_t replicas, const std::vector<WorkerSample>& workers,
                     absl::Time deadline) override;

  // The last count Scale advised for `pool` (-1: none yet).
  int64_t advice(PoolRole pool) const { return advice_[static_cast<int>(pool)]; }

 private:
  std::array<int64_t, kPoolRoles> advice_ = {-1, -1, -1};
};

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_ADVICE_ACTUATOR_H_
