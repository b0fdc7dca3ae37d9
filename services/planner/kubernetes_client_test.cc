#include "services/planner/kubernetes_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string WriteFile(const std::string& name, const std::string& content) {
  const std::string path = TempPath(name);
  std::ofstream(path) << content;
  return path;
}

// One connection on a loopback port: reads the request's headers, writes `answer` (nothing when
// empty), then holds the connection open until Release() (or closes it at once with
// close_at_once).
class OneShotServer {
 public:
  explicit OneShotServer(std::string answer, bool close_at_once = false)
      : answer_(std::move(answer)), close_at_once_(close_at_once) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~OneShotServer() {
    Release();
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  const std::string& request() const { return request_; }

 private:
  void Serve() {
    const int conn = accept(fd_, nullptr, nullptr);
    if (conn < 0) return;
    char buf[4096];
    while (!absl::StrContains(request_, "\r\n\r\n")) {
      const ssize_t n = read(conn, buf, sizeof(buf));
      if (n <= 0) break;
      request_.append(buf, n);
    }
    size_t sent = 0;
    while (sent < answer_.size()) {
      const ssize_t n = write(conn, answer_.data() + sent, answer_.size() - sent);
      if (n <= 0) break;
      sent += n;
    }
    if (!close_at_once_) released_.WaitForNotification();
    close(conn);
  }

  const std::string answer_;
  const bool close_at_once_;
  int fd_ = -1;
  int port_ = 0;
  std::string request_;
  absl::Notification released_;
  std::thread thread_;
};

absl::StatusOr<std::string> Get(const std::string& server, absl::Duration timeout,
                                const std::string& token_file = "", size_t max_body = 1 << 20) {
  KubernetesClientOptions options;
  options.server = server;
  options.token_file = token_file;
  options.max_response_bytes = max_body;
  auto client = KubernetesClient::Create(options);
  if (!client.ok()) return client.status();
  return (*client)->Call({"GET", "/api/v1/namespaces/ferry/pods", "labelSelector=a%3Db", "", ""},
                         absl::Now() + timeout);
}

TEST(QueryEscape, EscapesAllButUnreserved) {
  EXPECT_EQ(QueryEscape("app.kubernetes.io/name=ferry,app.kubernetes.io/component=decode"),
            "app.kubernetes.io%2Fname%3Dferry%2Capp.kubernetes.io%2Fcomponent%3Ddecode");
  EXPECT_EQ(QueryEscape("a b~_-"), "a%20b~_-");
}

TEST(KubernetesClient, RejectsBadUrls) {
  for (const char* url : {"", "ftp://x", "https://", "http://host/path", "http://a:b:c",
                          "http://host:0", "http://host:99999", "http://[::1"}) {
    KubernetesClientOptions options;
    options.server = url;
    EXPECT_EQ(KubernetesClient::Create(options).status().code(), absl::StatusCode::kInvalidArgument)
        << url;
  }
  KubernetesClientOptions ok;
  for (const char* url : {"http://10.0.0.1", "http://[fd00::1]:8080", "http://host:6443/"}) {
    ok.server = url;
    EXPECT_TRUE(KubernetesClient::Create(ok).ok()) << url;
  }
}

TEST(KubernetesClient, HttpsNeedsAReadablePemCaFile) {
  KubernetesClientOptions options;
  options.server = "https://10.96.0.1:443";
  EXPECT_EQ(KubernetesClient::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.ca_file = TempPath("no-such-ca.crt");
  EXPECT_EQ(KubernetesClient::Create(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options.ca_file = WriteFile("not-pem.crt", "this is no certificate\n");
  const absl::Status s = KubernetesClient::Create(options).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("CA file"));
}

TEST(KubernetesClient, SendsTheTokenFromItsFileAndNeverQuotesIt) {
  const std::string token = WriteFile("token", "  sekrit-token-1\n");
  OneShotServer server("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", true);
  const auto body = Get(server.url(), absl::Seconds(10), token);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "{}");
  EXPECT_THAT(server.request(),
              HasSubstr("GET /api/v1/namespaces/ferry/pods?labelSelector=a%3Db HTTP/1.1\r\n"));
  EXPECT_THAT(server.request(), HasSubstr("Authorization: Bearer sekrit-token-1\r\n"));

  const auto missing = Get(server.url(), absl::Seconds(10), TempPath("no-token"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string empty = WriteFile("empty-token", "\n");
  EXPECT_EQ(Get(server.url(), absl::Seconds(10), empty).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string bad = WriteFile("bad-token", "abc\r\nX-Injected: 1");
  const absl::Status s = Get(server.url(), absl::Seconds(10), bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("Injected")));
}

TEST(KubernetesClient, ErrorStatusCarriesTheServersMessage) {
  const std::string status =
      R"({"kind":"Status","code":404,"message":"pods \"x\" not found","reason":"NotFound"})";
  OneShotServer server(absl::StrCat("HTTP/1.1 404 Not Found\r\nContent-Length: ", status.size(),
                                    "\r\nContent-Type: application/json\r\n\r\n", status),
                       true);
  const absl::Status s = Get(server.url(), absl::Seconds(10)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(),
            "GET /api/v1/namespaces/ferry/pods?labelSelector=a%3Db: HTTP 404: pods \"x\" not "
            "found");
}

TEST(KubernetesClient, BoundsTheBody) {
  OneShotServer server(
      absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", std::string(5000, 'x')));
  const absl::Status s = Get(server.url(), absl::Seconds(10), "", 1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(KubernetesClient, BoundsAChunkedBody) {
  std::string chunks;
  for (int i = 0; i < 20; ++i) chunks += absl::StrCat("64\r\n", std::string(100, 'x'), "\r\n");
  OneShotServer server(
      absl::StrCat("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunks, "0\r\n\r\n"));
  const absl::Status s = Get(server.url(), absl::Seconds(10), "", 1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(KubernetesClient, AClaimedHugeBodyIsRefusedBeforeAnyAllocation) {
  // A Content-Length of 1 TB with a few bytes sent: refused on the header alone.
  OneShotServer server("HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\nxx");
  const absl::Status s = Get(server.url(), absl::Seconds(10)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(KubernetesClient, BoundsTheHeaders) {
  OneShotServer server(
      absl::StrCat("HTTP/1.1 200 OK\r\nX-Big: ", std::string(100000, 'h'), "\r\n\r\n"));
  EXPECT_EQ(Get(server.url(), absl::Seconds(10)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(KubernetesClient, NotHttpIsInternal) {
  OneShotServer server("SSH-2.0-OpenSSH_9.2\r\n\r\n");
  const absl::Status s = Get(server.url(), absl::Seconds(10)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
}

TEST(KubernetesClient, ClosedWithoutAnswerIsUnavailable) {
  OneShotServer server("", true);
  EXPECT_EQ(Get(server.url(), absl::Seconds(10)).status().code(), absl::StatusCode::kUnavailable);
}

TEST(KubernetesClient, NoAnswerByTheDeadline) {
  OneShotServer server("");  // reads the request, answers nothing until released
  const absl::Time start = absl::Now();
  const absl::Status s = Get(server.url(), absl::Milliseconds(300)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // A deadline already past: no connection at all.
  EXPECT_EQ(Get(server.url(), -absl::Seconds(1)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(KubernetesClient, RefusedConnectionIsUnavailable) {
  // A bound port nobody listens on refuses connections.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const absl::Status s =
      Get(absl::StrCat("http://127.0.0.1:", ntohs(addr.sin_port)), absl::Seconds(10)).status();
  close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace ferry
