// ferry-planner's service: every interval it reads a Snapshot of the pools from the routers
// (snapshot_reader.h), adds what the actuator has of each pool (actuator.h), lets the Planner
// decide (planner.h), and asks the actuator for every change the plan makes. It exports what it
// decided on its admin port:
//
//   GET /plan     the last round as JSON: its time, the routers that answered (and the errors of
//                 those that did not), per pool the decision with its inputs and how the actuator
//                 took it; and the recent decisions that changed a pool or blocked a scale-in.
//   GET /metrics  ferry_planner_desired_replicas{pool}, ferry_planner_replicas{pool,state}
//                 (ready, starting, draining), ferry_planner_utilisation{pool},
//                 ferry_planner_decisions_total{pool,action,reason},
//                 ferry_planner_scale_in_blocked_total{pool,reason},
//                 ferry_planner_actuator_errors_total{pool}, ferry_planner_snapshot_errors_total
//                 (router reads that failed) and ferry_planner_routers (routers that answered).
//   GET /healthz, /readyz  ready once a round has read a router; not ready while none answers.
//
// A change is asked of the actuator unless it said the pool is still changing, or answers that
// it is busy (Unavailable: locally, another pool's scale runs): then the change is deferred and
// the planner told (Planner::Rejected) so that it decides that pool again from the next
// snapshot; so is any other actuator error, which is also counted. A scale-in is blocked when the
// load alone would remove replicas (needed < current) but the planner holds for its cooldown, its
// hysteresis window or the utilisation rule. Every decision that changes a pool, every blocked
// scale-in and every actuator error is logged with its inputs and its reason (engine/common/log.h:
// JSON lines under --log_format=json).
//
// Threading: one loop thread runs the rounds; the admin server's thread reads what the last round
// left (under a mutex). Thread-safe. Stop() (or the destructor) ends the loop after the round it
// is in, then the admin server.

#ifndef FERRY_SERVICES_PLANNER_PLANNER_SERVICE_H_
#define FERRY_SERVICES_PLANNER_PLANNER_SERVICE_H_

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/admin_server.h"
#include "services/planner/actuator.h"
#include "services/planner/planner.h"
#include "services/planner/snapshot_reader.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace ferry {

struct PlannerServiceOptions {
  PlannerOptions planner;  // its interval_s is the service's round
  SnapshotReaderOptions reader;
  absl::Duration actuator_timeout = absl::Seconds(10);  // each actuator call's deadline
  std::string admin_host = "127.0.0.1";
  int admin_port = 0;
  size_t recent_decisions = 50;  // kept for GET /plan
  bool run_loop = true;          // false: no loop thread; rounds only by RunRound() (tests)

  absl::Status Validate() const;
};

class PlannerService {
 public:
  // Starts the admin server and the loop (its first round at once). Errors: bad options, the
  // admin port cannot be bound.
  static absl::StatusOr<std::unique_ptr<PlannerService>> Start(PlannerServiceOptions options,
                                                               std::unique_ptr<Actuator> actuator);
  ~PlannerService();

  int admin_port() const;

  // One round now: read, decide, actuate. Returns the plan. Called by the loop; tests call it
  // with run_loop = false.
  Plan RunRound();

  // The second half of a round, on a plan decided elsewhere (tests): what the actuator is asked,
  // the metrics, the log, GET /plan.
  void ApplyPlan(const Plan& plan, const Snapshot& snapshot);

  // GET /plan's body.
  std::string PlanJson() const;

  // Ends the loop (after the round it is in) and the admin server. Idempotent.
  void Stop();

 private:
  struct Metrics;

  using RouterErrors = std::vector<std::pair<std::string, absl::Status>>;

  PlannerService(PlannerServiceOptions options, std::unique_ptr<Actuator> actuator);
  void Loop();
  // Each pool's spec and starting replicas from the actuator (the pools it says are changing in
  // changing_).
  void AddActuatorView(Snapshot* snapshot, absl::Time deadline);
  void Apply(const Plan& plan, const Snapshot& snapshot, const RouterErrors& errors);

  const PlannerServiceOptions options_;
  std::unique_ptr<Actuator> actuator_;  // loop thread (RunRound's caller) only
  Planner planner_;                     // loop thread only
  SnapshotReader reader_;               // loop thread only
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<AdminServer> admin_;
  const absl::Duration started_;  // RealClock().Monotonic() at the start: snapshots' time 0

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_round_json_ ABSL_GUARDED_BY(mu_) = "null";
  std::deque<std::string> recent_ ABSL_GUARDED_BY(mu_);            // JSON objects, oldest first
  std::array<bool, kPoolRoles> changing_ = {false, false, false};  // loop thread only
  std::thread loop_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_PLANNER_SERVICE_H_
