// PLACEHOLDER (being written): holds every pool. Replaced before the issue lands.
#include "services/planner/planner.h"

namespace ferry {

const char* PlanActionName(PlanAction action) {
  switch (action) {
    case PlanAction::kHold:
      return "hold";
    case PlanAction::kScaleOut:
      return "scale_out";
    case PlanAction::kScaleIn:
      return "scale_in";
  }
  return "unknown";
}

absl::Status PlannerOptions::Validate() const { return absl::OkStatus(); }

Planner::Planner(PlannerOptions options) : options_(std::move(options)) {}

Plan Planner::Decide(const Snapshot& snapshot) {
  Plan plan;
  plan.time_s = snapshot.time_s;
  return plan;
}

void Planner::Rejected(PoolRole) {}

double Planner::startup_s(PoolRole) const { return options_.startup_s; }

}  // namespace ferry
