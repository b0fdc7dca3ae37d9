// A complete service process around EchoService, used by the multi-process tests of the shared
// plumbing (tests/integration): termination signal, gRPC server with health, admin HTTP server,
// and the standard shutdown sequence. Prints "grpc_port=N admin_port=M" once ready. The gauge
// ferry_echo_in_flight_calls lets a test see when its call is inside the handler.

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/common/log.h"
#include "prometheus/gauge.h"
#include "services/common/admin_server.h"
#include "services/common/grpc_server.h"
#include "services/common/metrics.h"
#include "services/common/service_lifecycle.h"
#include "services/common/termination_signal.h"
#include "services/common/testing/echo_service.h"

ABSL_FLAG(std::string, address, "127.0.0.1:0", "gRPC listen address");
ABSL_FLAG(int, admin_port, 0, "admin HTTP port (0 = any free port)");
ABSL_FLAG(int, rpc_grace_ms, 5000, "grace for in-flight calls at shutdown");
ABSL_FLAG(int, max_message_bytes, 1 << 20, "gRPC message size limit");

int main(int argc, char** argv) {
  auto signal = ferry::TerminationSignal::Install();  // before any thread
  CHECK_OK(signal.status());
  absl::ParseCommandLine(argc, argv);

  auto registry = ferry::NewServiceRegistry("echo");
  prometheus::Gauge& in_flight = prometheus::BuildGauge()
                                     .Name("ferry_echo_in_flight_calls")
                                     .Help("Echo calls currently inside the handler.")
                                     .Register(*registry)
                                     .Add({});
  ferry::EchoService echo(&in_flight);
  ferry::GrpcServerOptions grpc_options;
  grpc_options.address = absl::GetFlag(FLAGS_address);
  grpc_options.max_receive_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  auto grpc = ferry::GrpcServer::Start(grpc_options, {&echo});
  if (!grpc.ok()) {
    LOG(ERROR) << grpc.status();
    return 1;
  }
  ferry::AdminServerOptions admin_options;
  admin_options.port = absl::GetFlag(FLAGS_admin_port);
  auto admin = ferry::AdminServer::Start(admin_options, registry);
  if (!admin.ok()) {
    LOG(ERROR) << admin.status();
    return 1;
  }
  (*admin)->SetReady(true);
  std::printf("grpc_port=%d admin_port=%d\n", (*grpc)->port(), (*admin)->port());
  std::fflush(stdout);

  ferry::ShutdownOptions shutdown;
  shutdown.rpc_grace = absl::Milliseconds(absl::GetFlag(FLAGS_rpc_grace_ms));
  ferry::ServeUntilTerminated(**signal, **grpc, admin->get(), shutdown);
  return 0;
}
