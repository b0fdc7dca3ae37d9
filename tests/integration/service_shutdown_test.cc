// Multi-process test of the shutdown sequence every Ferry service uses (services/common): a real
// service process (services/common/testing:echo_server) gets SIGTERM while a call is in flight.
// The call must complete, readiness must drop while it does, and the process must exit 0.

#include <signal.h>

#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ferry/testing/v1/echo.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

std::string g_server_path;

// The echo server with `args`.
class EchoProcess : public ServiceProcess {
 public:
  explicit EchoProcess(const std::vector<std::string>& args)
      : ServiceProcess(g_server_path, args) {}
};

// Polls the service's /metrics until `count` Echo calls are inside the handler (or 10 s pass).
bool WaitForInFlightCalls(int admin_port, int count) {
  const std::string line = absl::StrCat("\nferry_echo_in_flight_calls ", count, "\n");
  for (int i = 0; i < 1000; ++i) {
    std::string metrics;
    if (HttpGet(admin_port, "/metrics", &metrics) == 200 &&
        ("\n" + metrics).find(line) != std::string::npos) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST(ServiceShutdownTest, SigtermDrainsInFlightCallsThenExitsZero) {
  EchoProcess service({"--rpc_grace_ms=10000"});
  ASSERT_TRUE(service.ready());
  EXPECT_EQ(HttpGet(service.admin_port(), "/readyz"), 200);
  EXPECT_EQ(HttpGet(service.admin_port(), "/healthz"), 200);

  auto stub = ferry::testing::v1::Echo::NewStub(
      NewChannel(absl::StrCat("127.0.0.1:", service.grpc_port())));
  absl::Status in_flight;
  std::string reply;
  std::thread caller([&] {
    ferry::testing::v1::EchoRequest request;
    request.set_message("finish me");
    request.set_delay_ms(3000);
    ferry::testing::v1::EchoResponse response;
    auto context = NewClientContext(absl::Seconds(20));
    in_flight = FromGrpcStatus(stub->Echo(context.get(), request, &response));
    reply = response.message();
  });
  ASSERT_TRUE(WaitForInFlightCalls(service.admin_port(), 1));
  service.Signal(SIGTERM);

  // Readiness drops while the call is still running.
  int ready_status = 200;
  for (int i = 0; i < 100 && ready_status == 200; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
    ready_status = HttpGet(service.admin_port(), "/readyz");
  }
  EXPECT_EQ(ready_status, 503);

  caller.join();
  EXPECT_TRUE(in_flight.ok()) << in_flight;
  EXPECT_EQ(reply, "finish me");
  EXPECT_EQ(service.WaitForExit(absl::Seconds(15)), 0);

  // The service is gone: new calls fail fast with UNAVAILABLE, never hang.
  ferry::testing::v1::EchoRequest request;
  ferry::testing::v1::EchoResponse response;
  auto context = NewClientContext(absl::Seconds(5));
  EXPECT_EQ(FromGrpcStatus(stub->Echo(context.get(), request, &response)).code(),
            absl::StatusCode::kUnavailable);
}

TEST(ServiceShutdownTest, GraceBoundsHowLongShutdownWaits) {
  EchoProcess service({"--rpc_grace_ms=200"});
  ASSERT_TRUE(service.ready());
  auto stub = ferry::testing::v1::Echo::NewStub(
      NewChannel(absl::StrCat("127.0.0.1:", service.grpc_port())));
  absl::Status in_flight;
  std::thread caller([&] {
    ferry::testing::v1::EchoRequest request;
    request.set_delay_ms(30000);
    ferry::testing::v1::EchoResponse response;
    auto context = NewClientContext(absl::Seconds(60));
    in_flight = FromGrpcStatus(stub->Echo(context.get(), request, &response));
  });
  ASSERT_TRUE(WaitForInFlightCalls(service.admin_port(), 1));
  const absl::Time start = absl::Now();
  service.Signal(SIGTERM);
  EXPECT_EQ(service.WaitForExit(absl::Seconds(15)), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  caller.join();
  EXPECT_FALSE(in_flight.ok());
}

TEST(ServiceShutdownTest, BusyPortFailsStartupWithNonZeroExit) {
  EchoProcess first({});
  ASSERT_TRUE(first.ready());
  EchoProcess second({absl::StrCat("--address=127.0.0.1:", first.grpc_port())});
  EXPECT_FALSE(second.ready());
  EXPECT_EQ(second.WaitForExit(absl::Seconds(10)), 1);
  first.Signal(SIGTERM);
  EXPECT_EQ(first.WaitForExit(absl::Seconds(15)), 0);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PATH_TO_ECHO_SERVER\n", argv[0]);
    return 2;
  }
  ferry::g_server_path = argv[1];
  return RUN_ALL_TESTS();
}
