#include "services/planner/actuator_factory.h"

#include "absl/strings/str_cat.h"
#include "services/planner/advice_actuator.h"

namespace ferry {

absl::StatusOr<std::unique_ptr<Actuator>> NewActuator(const ActuatorConfig& config) {
  if (config.name == "advice") return std::unique_ptr<Actuator>(new AdviceActuator());
  if (config.name == "local") {
    auto local = LocalActuator::Create(config.local);
    if (!local.ok()) return local.status();
    return std::unique_ptr<Actuator>(std::move(*local));
  }
  if (config.name == "kubernetes") {
    if (!config.kubernetes) {
      return absl::UnimplementedError("this build has no Kubernetes actuator");
    }
    return config.kubernetes();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown actuator '", config.name, "': local, kubernetes or advice"));
}

}  // namespace ferry
