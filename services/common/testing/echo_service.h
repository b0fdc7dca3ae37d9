// A test implementation of ferry.testing.v1.Echo (proto/ferry/testing/v1/echo.proto), used to
// exercise the shared gRPC plumbing in-process and across processes.

#ifndef FERRY_SERVICES_COMMON_TESTING_ECHO_SERVICE_H_
#define FERRY_SERVICES_COMMON_TESTING_ECHO_SERVICE_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
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
  int in_flight() const;
  // Calls that saw their cancellation while delaying.
  int cancelled() const;

  // Block until in_flight() / cancelled() is at least `n`, or `timeout` passes; whether it is.
  bool WaitForInFlight(int n, absl::Duration timeout) const;
  bool WaitForCancelled(int n, absl::Duration timeout) const;

 private:
  void Enter();
  void Leave(bool cancelled = false);

  prometheus::Gauge* const in_flight_gauge_;
  mutable absl::Mutex mu_;
  mutable absl::CondVar changed_;  // in_flight_ or cancelled_ changed
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_TESTING_ECHO_SERVICE_H_
