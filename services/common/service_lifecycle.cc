#include "services/common/service_lifecycle.h"

#include "absl/time/clock.h"
#include "engine/common/log.h"

namespace ferry {

int ServeUntilTerminated(TerminationSignal& signal, GrpcServer& grpc, AdminServer* admin,
                         const ShutdownOptions& options) {
  const int signal_number = signal.Wait();
  LOG(INFO) << "shutdown: no longer ready; draining";
  if (admin != nullptr) admin->SetReady(false, "shutting down");
  grpc.SetServing(false);
  if (options.drain) {
    const absl::Time deadline = absl::Now() + options.drain_grace;
    options.drain(deadline);
    if (absl::Now() > deadline + absl::Seconds(1)) {
      LOG(ERROR) << "shutdown: the drain step overran its deadline by " << absl::Now() - deadline;
    }
  }
  LOG(INFO) << "shutdown: stopping gRPC (in-flight calls get " << options.rpc_grace << ")";
  grpc.Shutdown(options.rpc_grace);
  if (admin != nullptr) admin->Stop();
  LOG(INFO) << "shutdown: complete";
  return signal_number;
}

}  // namespace ferry
