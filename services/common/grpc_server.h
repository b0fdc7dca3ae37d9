// A gRPC server as every Ferry service runs it: bound to a configured address (port 0 picks a
// free port, for tests), message sizes bounded, keepalive on, the standard grpc.health.v1 service
// (what Kubernetes gRPC probes call), and a graceful shutdown that lets in-flight calls finish
// within a grace period before cancelling the rest.

#ifndef FERRY_SERVICES_COMMON_GRPC_SERVER_H_
#define FERRY_SERVICES_COMMON_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"

namespace ferry {

struct GrpcServerOptions {
  // host:port. Services bind 127.0.0.1 unless configured otherwise; port 0 picks a free port.
  std::string address = "127.0.0.1:0";
  // Larger messages are refused with RESOURCE_EXHAUSTED before reaching a handler.
  int max_receive_message_bytes = 64 << 20;
  int max_send_message_bytes = 64 << 20;
  int max_concurrent_streams = 1024;
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
};

// Thread-safe.
class GrpcServer {
 public:
  // Starts serving `services` (not owned; they must outlive the server) and marks every service
  // SERVING in the health service.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const GrpcServerOptions& options, const std::vector<grpc::Service*>& services);

  ~GrpcServer();  // Shutdown(0) unless already shut down.

  int port() const { return port_; }
  // "host:port" with the bound port, for clients.
  const std::string& address() const { return address_; }

  // Health reported for the server ("") and every registered service.
  void SetServing(bool serving);

  // Marks NOT_SERVING, stops accepting calls, waits up to `grace` for in-flight calls, then
  // cancels the remaining ones. Returns when every handler has returned. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port, std::string address);

  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<grpc::Server> server_;
  const int port_;
  const std::string address_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_GRPC_SERVER_H_
