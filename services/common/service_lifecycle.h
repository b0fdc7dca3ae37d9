// The shutdown sequence shared by every Ferry service's main():
//
//   1. wait for SIGTERM/SIGINT (or a programmatic trigger);
//   2. report not ready (/readyz 503, gRPC health NOT_SERVING), so load balancers and routers
//      stop sending new work;
//   3. run the service's drain step (finish or hand off in-flight work), if any, which must
//      return by the deadline it is given (now + drain_grace);
//   4. shut the gRPC server down, letting calls still in flight finish within `rpc_grace`;
//   5. stop the admin server.
//
// The process then exits 0. Nothing acknowledged to a client is dropped by this sequence; what
// the drain step does with unfinished work is the service's contract.

#ifndef FERRY_SERVICES_COMMON_SERVICE_LIFECYCLE_H_
#define FERRY_SERVICES_COMMON_SERVICE_LIFECYCLE_H_

#include <functional>

#include "absl/time/time.h"
#include "services/common/admin_server.h"
#include "services/common/grpc_server.h"
#include "services/common/termination_signal.h"

namespace ferry {

struct ShutdownOptions {
  // How long in-flight calls may run after the drain step before they are cancelled.
  absl::Duration rpc_grace = absl::Seconds(10);
  // Service-specific drain (e.g. decode: keep decoding, then hand off). May be empty. It is
  // given its deadline and must return by then (ending what it could not finish); a drain that
  // overruns is logged, and the sequence goes on when it returns.
  std::function<void(absl::Time deadline)> drain;
  absl::Duration drain_grace = absl::Seconds(30);
};

// Blocks until termination is requested, then runs the sequence above. `admin` may be null.
// Returns the signal number that started it (0 when triggered programmatically).
int ServeUntilTerminated(TerminationSignal& signal, GrpcServer& grpc, AdminServer* admin,
                         const ShutdownOptions& options);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_SERVICE_LIFECYCLE_H_
