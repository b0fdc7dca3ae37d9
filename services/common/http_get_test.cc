#include "services/common/http_get.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "boost/asio/ip/tcp.hpp"
#include "gtest/gtest.h"
#include "services/common/admin_server.h"

namespace ferry {
namespace {

using tcp = boost::asio::ip::tcp;

std::unique_ptr<AdminServer> Serve() {
  AdminServerOptions options;
  options.routes = [](const std::string& method, const std::string& path, const std::string&,
                      AdminReply* reply) {
    if (method != "GET") return false;
    if (path == "/hello") {
      reply->content_type = "text/plain";
      reply->body = "hello";
      return true;
    }
    if (path == "/big") {
      reply->body = std::string(4096, 'x');
      return true;
    }
    if (path == "/broken") {
      reply->status = 500;
      reply->body = "it broke";
      return true;
    }
    return false;
  };
  auto server = AdminServer::Start(options, nullptr);
  EXPECT_TRUE(server.ok()) << server.status();
  return std::move(*server);
}

TEST(HttpGetTest, ReturnsTheBodyOfA200) {
  auto server = Serve();
  const std::string address = absl::StrCat("127.0.0.1:", server->port());
  auto body = HttpGet(address, "/hello", absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "hello");
  // A name resolves too.
  body = HttpGet(absl::StrCat("localhost:", server->port()), "/hello",
                 absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "hello");
}

TEST(HttpGetTest, NamesWhatWentWrong) {
  auto server = Serve();
  const std::string address = absl::StrCat("127.0.0.1:", server->port());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto missing = HttpGet(address, "/nothing", deadline);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  auto broken = HttpGet(address, "/broken", deadline);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(broken.status().message().find("HTTP 500: it broke"), std::string::npos)
      << broken.status();
  HttpGetOptions small;
  small.max_body_bytes = 1000;
  EXPECT_EQ(HttpGet(address, "/big", deadline, small).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(HttpGet(address, "/big", deadline).ok());
  EXPECT_EQ(HttpGet("no-port", "/hello", deadline).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpGet(address, "hello", deadline).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpGet(address, "/hello", absl::Now() - absl::Seconds(1)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(HttpGetTest, AClosedPortIsUnavailable) {
  boost::asio::io_context io;
  int port = 0;
  {
    tcp::acceptor acceptor(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    port = acceptor.local_endpoint().port();
  }  // closed: nothing listens there now
  auto got = HttpGet(absl::StrCat("127.0.0.1:", port), "/x", absl::Now() + absl::Seconds(10));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
}

TEST(HttpGetTest, AServerThatNeverAnswersRunsIntoTheDeadline) {
  // A listener that never accepts: the kernel completes the connection, no answer ever comes.
  boost::asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
  const absl::Time start = absl::Now();
  auto got = HttpGet(absl::StrCat("127.0.0.1:", acceptor.local_endpoint().port()), "/x",
                     start + absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  EXPECT_GE(took, absl::Milliseconds(250));
  EXPECT_LT(took, absl::Seconds(5));
}

}  // namespace
}  // namespace ferry
