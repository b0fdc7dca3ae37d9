#include "services/common/testing/echo_service.h"

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"

namespace ferry {

int EchoService::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

int EchoService::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool EchoService::WaitForInFlight(int n, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (in_flight_ < n && !changed_.WaitWithDeadline(&mu_, deadline)) {
  }
  return in_flight_ >= n;
}

bool EchoService::WaitForCancelled(int n, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (cancelled_ < n && !changed_.WaitWithDeadline(&mu_, deadline)) {
  }
  return cancelled_ >= n;
}

void EchoService::Enter() {
  absl::MutexLock lock(&mu_);
  ++in_flight_;
  if (in_flight_gauge_ != nullptr) in_flight_gauge_->Increment();
  changed_.SignalAll();
}

void EchoService::Leave(bool cancelled) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  if (cancelled) ++cancelled_;
  if (in_flight_gauge_ != nullptr) in_flight_gauge_->Decrement();
  changed_.SignalAll();
}

grpc::Status EchoService::Echo(grpc::ServerContext* context,
                               const ferry::testing::v1::EchoRequest* request,
                               ferry::testing::v1::EchoResponse* response) {
  Enter();
  const absl::Time until = absl::Now() + absl::Milliseconds(request->delay_ms());
  while (absl::Now() < until) {
    if (context->IsCancelled()) {
      Leave(/*cancelled=*/true);
      return grpc::Status::CANCELLED;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  Leave();
  if (request->error_code() != 0) {
    return ToGrpcStatus(
        absl::Status(static_cast<absl::StatusCode>(request->error_code()), request->message()));
  }
  response->set_message(request->message());
  response->set_payload_bytes(request->payload().size());
  response->set_trace_id(TraceIdOf(*context));
  return grpc::Status::OK;
}

}  // namespace ferry
