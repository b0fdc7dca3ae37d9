// The local actuator (actuator.h): sizes the pools of the stack `./ferry up` runs by calling
// `./ferry scale POOL N --grace GRACE` (POOL: prefill, decode, or worker for the aggregated
// pool), in the background and one at a time: the script holds a lock of its own, and a
// scale-down waits for the drained workers to exit (up to the grace + 60 s), far longer than a
// planner interval.
//
//   Replicas(pool)  the running scale's target while one runs (ready: the workers the pool had
//                   before a scale-up, the target of a scale-down; changing: true, for every
//                   pool); else the pool's workers in the stack's record (STATE/order, where
//                   `./ferry up` and `./ferry scale` list the workers they started: decode0,
//                   decode1, ...), all of them counted ready (the router's view says which are).
//                   A scale that ended badly since the last call is reported once, as this
//                   call's error (its exit status and the end of its output).
//   Scale(pool, n)  starts `FERRY_SCRIPT scale POOL n --grace GRACE` (FERRY_STATE=state_dir in its
//                   environment) and returns; Unavailable while another scale runs.
//
// A scale has a deadline: for a scale-down the grace + `script_wait` (60 s: the script's wait for
// a drained worker's exit beyond its grace) + `margin`, for a scale-up `startup_timeout` per
// worker added + `script_wait` + `margin`. One that outlives it is reported once
// (DeadlineExceeded) and left to end by itself, never killed: the script's own waits are bounded,
// and killing it halfway would leave workers running that the stack's record does not list.
// Errors: the stack is not running (no STATE/order: Unavailable); the stack has no such pool
// (NotFound); n outside the script's 1..49 (1..99 for worker) (InvalidArgument); the script
// cannot be started (its errno).
//
// The script runs in its own process group with default signal dispositions, and inherits no
// descriptor of the planner but its output file. Thread-compatible (actuator.h); the destructor
// waits for a running scale up to `shutdown_wait`, then leaves it running.

#ifndef FERRY_SERVICES_PLANNER_LOCAL_ACTUATOR_H_
#define FERRY_SERVICES_PLANNER_LOCAL_ACTUATOR_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/planner/actuator.h"
#include "services/planner/pool_snapshot.h"

namespace ferry {

struct LocalActuatorOptions {
  std::string ferry_script = "./ferry";      // the repository's `ferry` (or a stand-in, in tests)
  std::string state_dir;                     // the stack's FERRY_STATE (required)
  absl::Duration grace = absl::Seconds(30);  // --grace of a scale-down (whole seconds, >= 1)
  absl::Duration startup_timeout = absl::Seconds(300);  // a worker's start (FERRY_UP_TIMEOUT)
  absl::Duration script_wait = absl::Seconds(60);
  absl::Duration margin = absl::Seconds(60);
  absl::Duration shutdown_wait = absl::Seconds(10);
  // The script's stdout and stderr (replaced by each scale); empty: STATE/logs/planner-scale.log.
  std::string output_file;

  absl::Status Validate() const;
};

class LocalActuator final : public Actuator {
 public:
  static absl::StatusOr<std::unique_ptr<LocalActuator>> Create(LocalActuatorOptions options);
  ~LocalActuator() override;

  const char* name() const override { return "local"; }
  absl::StatusOr<PoolReplicas> Replicas(PoolRole pool, absl::Time deadline) override;
  absl::Status Scale(PoolRole pool, int64_t replicas, const std::vector<WorkerSample>& workers,
                     absl::Time deadline) override;

  // Blocks until no scale runs, or `deadline`; true when none runs.
  bool WaitIdle(absl::Time deadline);

  // The script's pool name: "prefill", "decode", "worker".
  static const char* ScriptPool(PoolRole pool);

 private:
  struct Running {
    pid_t pid = -1;
    int pidfd = -1;
    PoolRole pool = PoolRole::kDecode;
    int64_t from = 0, to = 0;
    absl::Time deadline;
    bool overdue_reported = false;
  };

  explicit LocalActuator(LocalActuatorOptions options);
  // Reaps the running scale if it ended (recording a failure for its pool), waiting for its end
  // up to `until`; records once that it is past its deadline.
  void Reap(absl::Time until);
  absl::StatusOr<int64_t> RecordedWorkers(PoolRole pool) const;
  std::string OutputTail() const;

  const LocalActuatorOptions options_;
  std::unique_ptr<Running> running_;
  // Per pool, a failure not yet reported.
  absl::Status failed_[kPoolRoles];
};

}  // namespace ferry

#endif  // FERRY_SERVICES_PLANNER_LOCAL_ACTUATOR_H_
