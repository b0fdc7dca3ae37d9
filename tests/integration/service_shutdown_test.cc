// Multi-process test of the shutdown sequence every Ferry service uses (services/common): a real
// service process (services/common/testing:echo_server) gets SIGTERM while a call is in flight.
// The call must complete, readiness must drop while it does, and the process must exit 0.

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "ferry/testing/v1/echo.grpc.pb.h"
#include "gtest/gtest.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"

extern char** environ;

namespace ferry {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

std::string g_server_path;

// A child process that prints "grpc_port=N admin_port=M" when ready.
class ServiceProcess {
 public:
  explicit ServiceProcess(const std::vector<std::string>& args) {
    int pipe_fds[2];
    CHECK_PIPE(pipe(pipe_fds));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, pipe_fds[0]);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(g_server_path.c_str()));
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    spawned_ =
        posix_spawn(&pid_, g_server_path.c_str(), &actions, nullptr, argv.data(), environ) == 0;
    posix_spawn_file_actions_destroy(&actions);
    close(pipe_fds[1]);
    FILE* out = fdopen(pipe_fds[0], "r");
    if (spawned_ && out != nullptr) {
      ready_ = std::fscanf(out, "grpc_port=%d admin_port=%d", &grpc_port_, &admin_port_) == 2;
    }
    if (out != nullptr) std::fclose(out);
  }

  ~ServiceProcess() {
    if (spawned_ && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  bool ready() const { return ready_; }
  int grpc_port() const { return grpc_port_; }
  int admin_port() const { return admin_port_; }
  void Signal(int sig) { kill(pid_, sig); }

  // Waits up to `timeout` for exit; returns the exit status, or -1 on timeout / abnormal exit.
  int WaitForExit(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return -1;
  }

 private:
  static void CHECK_PIPE(int rc) {
    if (rc != 0) std::abort();
  }
  pid_t pid_ = 0;
  bool spawned_ = false;
  bool ready_ = false;
  bool reaped_ = false;
  int grpc_port_ = 0;
  int admin_port_ = 0;
};

// GET `target`; returns the status (or -1 when the server cannot be reached) and the body.
int HttpGet(int port, const std::string& target, std::string* body = nullptr) {
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  beast::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  if (ec) return -1;
  http::request<http::empty_body> request(http::verb::get, target, 11);
  http::write(socket, request, ec);
  if (ec) return -1;
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(socket, buffer, response, ec);
  if (ec) return -1;
  if (body != nullptr) *body = response.body();
  return response.result_int();
}

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
  ServiceProcess service({"--rpc_grace_ms=10000"});
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
  ServiceProcess service({"--rpc_grace_ms=200"});
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
  ServiceProcess first({});
  ASSERT_TRUE(first.ready());
  ServiceProcess second({absl::StrCat("--address=127.0.0.1:", first.grpc_port())});
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
