#include "services/common/admin_server.h"

#include <string>

#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "services/common/metrics.h"

namespace ferry {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct Reply {
  int status = 0;
  std::string body;
  std::string content_type;
};

// One request on a fresh connection; `extra_header` lets a test make the request oversized.
Reply Get(int port, const std::string& target, http::verb verb = http::verb::get,
          const std::string& extra_header = "") {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  http::request<http::string_body> request(verb, target, 11);
  request.set(http::field::host, "127.0.0.1");
  if (!extra_header.empty()) request.set("x-padding", extra_header);
  request.keep_alive(false);
  http::write(socket, request);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  beast::error_code ec;
  http::read(socket, buffer, response, ec);
  Reply reply;
  if (ec) return reply;
  reply.status = response.result_int();
  reply.body = response.body();
  reply.content_type = std::string(response[http::field::content_type]);
  return reply;
}

TEST(AdminServerTest, HealthReadinessAndMetrics) {
  auto registry = NewServiceRegistry("test-service");
  auto& requests = prometheus::BuildCounter()
                       .Name("ferry_test_requests_total")
                       .Help("test counter")
                       .Register(*registry)
                       .Add({{"route", "x"}});
  requests.Increment(3);

  auto server = AdminServer::Start({}, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);

  EXPECT_EQ(Get(port, "/healthz").status, 200);
  Reply ready = Get(port, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body, "not ready: starting\n");
  (*server)->SetReady(true);
  EXPECT_EQ(Get(port, "/readyz").status, 200);
  (*server)->SetReady(false, "draining");
  EXPECT_EQ(Get(port, "/readyz").body, "not ready: draining\n");

  const Reply metrics = Get(port, "/metrics");
  EXPECT_EQ(metrics.status, 200);
  EXPECT_NE(metrics.content_type.find("version=0.0.4"), std::string::npos);
  EXPECT_NE(metrics.body.find("ferry_test_requests_total{route=\"x\"} 3"), std::string::npos)
      << metrics.body;
  EXPECT_NE(metrics.body.find("ferry_build_info{service=\"test-service\""), std::string::npos);
  EXPECT_NE(metrics.body.find("ferry_process_start_time_seconds"), std::string::npos);
}

TEST(AdminServerTest, UnknownPathsMethodsAndOversizedRequests) {
  auto server = AdminServer::Start({}, nullptr);
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  EXPECT_EQ(Get(port, "/nope").status, 404);
  EXPECT_EQ(Get(port, "/metrics").status, 404);  // no registry
  EXPECT_EQ(Get(port, "/healthz", http::verb::post).status, 405);
  EXPECT_EQ(Get(port, "/healthz", http::verb::get, std::string(16 * 1024, 'a')).status, 400);
  EXPECT_EQ(Get(port, "/healthz?verbose=1").status, 200);
  // Still serving after the bad requests.
  EXPECT_EQ(Get(port, "/healthz").status, 200);
}

TEST(AdminServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  auto server = AdminServer::Start({}, nullptr);
  ASSERT_TRUE(server.ok());
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), (*server)->port()));
  beast::flat_buffer buffer;
  for (int i = 0; i < 3; ++i) {
    http::request<http::string_body> request(http::verb::get, "/healthz", 11);
    request.keep_alive(true);
    http::write(socket, request);
    http::response<http::string_body> response;
    http::read(socket, buffer, response);
    EXPECT_EQ(response.result_int(), 200);
  }
}

TEST(AdminServerTest, BadAddressesAreErrors) {
  AdminServerOptions options;
  options.host = "not-an-ip";
  EXPECT_EQ(AdminServer::Start(options, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto first = AdminServer::Start({}, nullptr);
  ASSERT_TRUE(first.ok());
  options.host = "127.0.0.1";
  options.port = (*first)->port();
  // reuse_address does not allow two listeners on one port.
  EXPECT_EQ(AdminServer::Start(options, nullptr).status().code(), absl::StatusCode::kUnavailable);
}

TEST(AdminServerTest, StopClosesThePort) {
  auto server = AdminServer::Start({}, nullptr);
  ASSERT_TRUE(server.ok());
  const int port = (*server)->port();
  (*server)->Stop();
  (*server)->Stop();  // idempotent
  asio::io_context io;
  tcp::socket socket(io);
  beast::error_code ec;
  socket.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  EXPECT_TRUE(ec);
}

}  // namespace
}  // namespace ferry
