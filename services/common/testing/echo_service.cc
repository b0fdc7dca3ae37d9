#include "services/common/testing/echo_service.h"

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"

namespace ferry {

void EchoService::Enter() {
  ++in_flight_;
  if (in_flight_gauge_ != nullptr) in_flight_gauge_->Increment();
}

void EchoService::Leave() {
  --in_flight_;
  if (in_flight_gauge_ != nullptr) in_flight_gauge_->Decrement();
}

grpc::Status EchoService::Echo(grpc::ServerContext* context,
                               const ferry::testing::v1::EchoRequest* request,
                               ferry::testing::v1::EchoResponse* response) {
  Enter();
  const absl::Time until = absl::Now() + absl::Milliseconds(request->delay_ms());
  while (absl::Now() < until) {
    if (context->IsCancelled()) {
      ++cancelled_;
      Leave();
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
