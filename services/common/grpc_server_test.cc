// The gRPC plumbing end to end, in one process: a real server on 127.0.0.1 (port 0) and a real
// client channel.

#include "services/common/grpc_server.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "ferry/testing/v1/echo.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"
#include "services/common/testing/echo_service.h"

namespace ferry {
namespace {

using ferry::testing::v1::Echo;
using ferry::testing::v1::EchoRequest;
using ferry::testing::v1::EchoResponse;
using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class GrpcServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions options;
    options.max_receive_message_bytes = 64 * 1024;
    auto server = GrpcServer::Start(options, {&echo_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    channel_ = NewChannel(server_->address());
    stub_ = Echo::NewStub(channel_);
  }

  absl::Status Call(const EchoRequest& request, EchoResponse* response,
                    absl::Duration timeout = absl::Seconds(10), absl::string_view trace = "") {
    auto context = NewClientContext(timeout, trace);
    return FromGrpcStatus(stub_->Echo(context.get(), request, response));
  }

  HealthCheckResponse::ServingStatus Health() {
    auto stub = Health::NewStub(channel_);
    auto context = NewClientContext(absl::Seconds(5));
    HealthCheckRequest request;
    HealthCheckResponse response;
    const grpc::Status status = stub->Check(context.get(), request, &response);
    if (!status.ok()) return HealthCheckResponse::UNKNOWN;
    return response.status();
  }

  EchoService echo_;
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Echo::Stub> stub_;
};

TEST_F(GrpcServerTest, RoundTripWithTraceId) {
  EXPECT_GT(server_->port(), 0);
  EXPECT_EQ(server_->address(), "127.0.0.1:" + std::to_string(server_->port()));
  EchoRequest request;
  request.set_message("hello");
  request.set_payload(std::string(1000, 'x'));
  EchoResponse response;
  ASSERT_TRUE(Call(request, &response, absl::Seconds(10), "trace-42").ok());
  EXPECT_EQ(response.message(), "hello");
  EXPECT_EQ(response.payload_bytes(), 1000u);
  EXPECT_EQ(response.trace_id(), "trace-42");
}

TEST_F(GrpcServerTest, HandlerErrorsArriveWithCodeAndMessage) {
  EchoRequest request;
  request.set_message("no such block");
  request.set_error_code(static_cast<int>(absl::StatusCode::kNotFound));
  EchoResponse response;
  EXPECT_EQ(Call(request, &response), absl::NotFoundError("no such block"));
}

TEST_F(GrpcServerTest, OversizedMessagesAreRefused) {
  EchoRequest request;
  request.set_payload(std::string(100 * 1024, 'x'));  // limit is 64 KiB
  EchoResponse response;
  const absl::Status status = Call(request, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_EQ(echo_.in_flight(), 0);
}

TEST_F(GrpcServerTest, DeadlineExceededIsReportedAndTheHandlerSeesCancellation) {
  EchoRequest request;
  request.set_delay_ms(5000);
  EchoResponse response;
  const absl::Time start = absl::Now();
  const absl::Status status = Call(request, &response, absl::Milliseconds(200));
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  // The handler notices the cancelled call and stops (it polls every 5 ms).
  EXPECT_TRUE(echo_.WaitForCancelled(1, absl::Seconds(2)));
  EXPECT_EQ(echo_.cancelled(), 1);
}

TEST_F(GrpcServerTest, HealthFollowsServingState) {
  EXPECT_EQ(Health(), HealthCheckResponse::SERVING);
  server_->SetServing(false);
  EXPECT_EQ(Health(), HealthCheckResponse::NOT_SERVING);
  server_->SetServing(true);
  EXPECT_EQ(Health(), HealthCheckResponse::SERVING);
}

TEST_F(GrpcServerTest, GracefulShutdownLetsInFlightCallsFinish) {
  std::atomic<bool> done{false};
  absl::Status in_flight_status;
  std::thread caller([&] {
    EchoRequest request;
    request.set_message("slow");
    request.set_delay_ms(300);
    EchoResponse response;
    in_flight_status = Call(request, &response);
    done = true;
  });
  ASSERT_TRUE(echo_.WaitForInFlight(1, absl::Seconds(2)));
  ASSERT_EQ(echo_.in_flight(), 1);
  server_->Shutdown(absl::Seconds(10));
  caller.join();
  EXPECT_TRUE(in_flight_status.ok()) << in_flight_status;
  // New calls are refused once the server is down.
  EchoRequest request;
  EchoResponse response;
  EXPECT_EQ(Call(request, &response, absl::Seconds(2)).code(), absl::StatusCode::kUnavailable);
  server_->Shutdown(absl::Seconds(1));  // idempotent
}

TEST_F(GrpcServerTest, ShutdownWithoutGraceCancelsLongCalls) {
  absl::Status in_flight_status;
  std::thread caller([&] {
    EchoRequest request;
    request.set_delay_ms(20000);
    EchoResponse response;
    in_flight_status = Call(request, &response, absl::Seconds(30));
  });
  ASSERT_TRUE(echo_.WaitForInFlight(1, absl::Seconds(2)));
  ASSERT_EQ(echo_.in_flight(), 1);
  const absl::Time start = absl::Now();
  server_->Shutdown(absl::Milliseconds(100));
  caller.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_FALSE(in_flight_status.ok());
  EXPECT_EQ(echo_.cancelled(), 1);
}

TEST(GrpcServerStartTest, ABusyPortIsAClearError) {
  EchoService echo;
  auto first = GrpcServer::Start({}, {&echo});
  ASSERT_TRUE(first.ok());
  GrpcServerOptions options;
  options.address = (*first)->address();
  EchoService echo2;
  auto second = GrpcServer::Start(options, {&echo2});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find((*first)->address()), absl::string_view::npos);
}

}  // namespace
}  // namespace ferry
