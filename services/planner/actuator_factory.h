// Builds ferry-planner's actuator (actuator.h) by its --actuator name: "local" (local_actuator.h),
// "kubernetes" (kubernetes_actuator.h) or "advice" (advice_actuator.h).
//
// The Kubernetes actuator is built by the function `kubernetes` holds (ferry-planner's main binds
// it to NewKubernetesActuator with its flags), so that this library, and the tests of the service,
// need not link the HTTPS client. Stateless; thread-safe.

#ifndef FERRY_SERVICES_PLANNER_ACTUATOR_FACTORY_H_
#define FERRY_SERVICES_PLANNER_ACTUATOR_FACTORY_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/planner/actuator.h"
#include "services/planner/local_actuator.h"

namespace ferry {

struct ActuatorConfig {
  std::string name = "advice";
  LocalActuatorOptions local;
  // Builds the Kubernetes actuator; empty: "kubernetes" is Unimplemented.
  std::function<absl::StatusOr<std::unique_ptr<Actuator>>()> kubernetes;
};

// Errors: an unknown name (InvalidArgument); the chosen actuator's own (its options).
absl::StatusOr<std::unique_ptr<Actuator>> NewActuator(const ActuatorConfig& config);

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_ACTUATOR_FACTORY_H_
