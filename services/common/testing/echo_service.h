// A test implementation of ferry.testing.v1.Echo (proto/ferry/testing/v1/echo.proto), used to
// exercise the shared gRPC plumbing in-process and across processes.

#ifndef FERRY_SERVICES_COMMON_TESTING_ECHO_SERVICE_H_
#define FERRY_SERVICES_COMMON_TESTING_ECHO_SERVICE_H_

#include <atomic>

#include "ferry/testing/v1/echo.grpc.pb.h"
#include "prometheus/gauge.h"

namespace ferry {

// Thread-safe.
class EchoService final : public ferry::testing::v1::Echo::Service {
 public:
  // `in_flight_gauge` (optional, not owned) mirrors in_flight() for out-of-process observers.
  explicit EchoService(prometheus::Gauge* in_flight_gauge = nullptr)
      : in_flight_gauge_(in_flight_gauge) {}

  grpc::Status Echo(grpc::ServerContext* context, const ferry::testing::v1::EchoRequest* request,
                    ferry::testing::v1::EchoResponse* response) override;

  // Calls currently inside Echo().
  int in_flight() const { return in_flight_.load(); }
  // Calls that saw their cancellation while delaying.
  int cancelled() const { return cancelled_.load(); }

 private:
  void Enter();
  void Leave();

  prometheus::Gauge* const in_flight_gauge_;
  std::atomic<int> in_flight_{0};
  std::atomic<int> cancelled_{0};
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_TESTING_ECHO_SERVICE_H_
