// The admin HTTP endpoint every Ferry service exposes on its own port (separate from the
// data-plane port): GET /metrics (Prometheus text format from a prometheus-cpp registry),
// GET /healthz (liveness: the process and its event loop answer) and GET /readyz (readiness:
// the service wants traffic; false while starting or draining).
//
// Built on Boost.Beast, one I/O thread; requests are small and bounded (8 KiB of headers, 1 KiB
// of body), idle connections close after a timeout. Services may add routes (AdminRoute).

#ifndef FERRY_SERVICES_COMMON_ADMIN_SERVER_H_
#define FERRY_SERVICES_COMMON_ADMIN_SERVER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "prometheus/registry.h"

namespace ferry {

// A service's own admin routes (the router's GET /workers, POST /workers/{id}/drain): called on
// the admin server's I/O thread for every request before the built-in paths; return false to
// leave the request to them. Must not block for long.
struct AdminReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};
using AdminRoute = std::function<bool(const std::string& method, const std::string& path,
                                      const std::string& body, AdminReply* reply)>;

struct AdminServerOptions {
  // Numeric IP to bind; port 0 picks a free port.
  std::string host = "127.0.0.1";
  int port = 0;
  absl::Duration idle_timeout = absl::Seconds(30);
  AdminRoute routes;  // optional
};

// Thread-safe.
class AdminServer {
 public:
  // `registry` (may be null: /metrics then answers 404) is shared with the metric owners.
  static absl::StatusOr<std::unique_ptr<AdminServer>> Start(
      const AdminServerOptions& options, std::shared_ptr<prometheus::Registry> registry);

  ~AdminServer();  // Stop()

  int port() const;

  // /readyz answers 200 when ready, 503 with `reason` otherwise. Starts not ready.
  void SetReady(bool ready, const std::string& reason = "");

  // Closes the listener and every connection; returns when the I/O thread has exited.
  void Stop();

 private:
  class Impl;
  explicit AdminServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_ADMIN_SERVER_H_
