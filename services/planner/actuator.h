// The seam between the planner's decisions and what runs the workers: an Actuator sets a pool's
// replica count and says what it has. Three implementations, chosen by ferry-planner's
// --actuator: the local stack (local_actuator.h: `./ferry scale`, one call at a time, in the
// background), Kubernetes (kubernetes_actuator.h: the Deployments' scale subresource through the
// API server, and pod-deletion-cost so that scale-in removes the least-loaded pods) and advice
// (advice_actuator.h: changes nothing; ferry_planner_desired_replicas{pool} is for an HPA).
//
// Thread-compatible: the planner service calls one actuator from its one loop thread. Calls
// return within their deadline; a scale that takes long (a local scale-down drains) runs in the
// background and shows in Replicas() until it ends.

#ifndef FERRY_SERVICES_PLANNER_ACTUATOR_H_
#define FERRY_SERVICES_PLANNER_ACTUATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/planner/pool_snapshot.h"

namespace ferry {

// What the actuator has of one pool.
struct PoolReplicas {
  int64_t spec = -1;      // replicas asked for (-1: the pool does not exist here)
  int64_t ready = 0;      // of them, ready
  bool changing = false;  // a scale of this pool (or, locally, of any pool) is under way
};

class Actuator {
 public:
  virtual ~Actuator() = default;

  // "local", "kubernetes" or "advice".
  virtual const char* name() const = 0;

  // What the actuator has of `pool` now. Errors: the API server or the stack cannot be asked
  // (Unavailable, DeadlineExceeded), the pool is not known (NotFound).
  virtual absl::StatusOr<PoolReplicas> Replicas(PoolRole pool, absl::Time deadline) = 0;

  // Sets `pool` to `replicas`. `workers` is the pool as the router lists it (the snapshot's), for
  // an actuator that chooses which replicas go on scale-in (Kubernetes: pod-deletion-cost from
  // each pod's load). Returns once the change is asked for, not done. Errors: a change of this
  // pool (locally: of any pool) is still under way (Unavailable: ask again later), the request
  // failed (its status, with the API server's or the script's message).
  virtual absl::Status Scale(PoolRole pool, int64_t replicas,
                             const std::vector<WorkerSample>& workers, absl::Time deadline) = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_ACTUATOR_H_
