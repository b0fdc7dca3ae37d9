// EpollSseClient against PacedSseUpstream, both in this process: every stream gets its tokens
// and [DONE], arrivals are recorded and bounded; a server that answers something other than a
// 200 SSE stream, or nothing, fails the stream with a reason and never hangs the loop.

#include "tools/bench/epoll_sse_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tools/bench/paced_sse_upstream.h"

namespace ferry {
namespace {

std::string Body(int max_tokens) {
  return "{\"model\":\"smol\",\"stream\":true,\"max_tokens\":" + std::to_string(max_tokens) +
         ",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
}

TEST(EpollSseClientTest, ReadsEveryStreamToDone) {
  auto upstream = PacedSseUpstream::Start(std::chrono::milliseconds(2), 64, 250);
  ASSERT_TRUE(upstream.ok()) << upstream.status();
  EpollSseClientOptions o;
  o.port = (*upstream)->port();
  o.streams = 20;
  o.body = [](int i) { return Body(5 + i % 3); };
  o.max_arrivals_per_stream = 6;
  auto client = EpollSseClient::Create(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Run().ok());
  EXPECT_EQ((*client)->streams_ended(), 20);
  EXPECT_EQ((*client)->streams_started(), 20);
  int64_t total = 0;
  for (int i = 0; i < 20; ++i) {
    const EpollSseClient::Stream& s = (*client)->stream(i);
    EXPECT_TRUE(s.ok) << i << ": " << s.error;
    EXPECT_EQ(s.tokens, 5 + i % 3);
    EXPECT_EQ(s.arrivals.size(), std::min<size_t>(6, static_cast<size_t>(s.tokens)));
    EXPECT_EQ(s.event_bytes, 250);  // the upstream pads a token's event to 250 bytes
    for (size_t k = 1; k < s.arrivals.size(); ++k) EXPECT_LE(s.arrivals[k - 1], s.arrivals[k]);
    total += s.tokens;
  }
  EXPECT_EQ((*client)->tokens(), total);
}

// A listener that answers each connection with `reply` and closes it.
class FixedServer {
 public:
  explicit FixedServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      for (int i = 0; i < 2; ++i) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[4096];
        if (recv(c, buf, sizeof(buf), 0) <= 0) {
          close(c);
          continue;
        }
        if (send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL) < 0) {
          // The client may have gone; the test checks what it saw.
        }
        close(c);
      }
    });
  }
  ~FixedServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

void ExpectBothFail(const std::string& reply, const std::string& reason) {
  FixedServer server(reply);
  EpollSseClientOptions o;
  o.port = server.port();
  o.streams = 2;
  o.body = [](int) { return Body(3); };
  o.max_buffer_bytes = 1024;
  auto client = EpollSseClient::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Run().ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE((*client)->stream(i).failed);
    EXPECT_NE((*client)->stream(i).error.find(reason), std::string::npos)
        << (*client)->stream(i).error;
  }
}

TEST(EpollSseClientTest, FailsStreamsOnBadAnswers) {
  ExpectBothFail("HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n", "429");
  ExpectBothFail("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                 "malformed chunk-size");
  ExpectBothFail("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                 "before data: [DONE]");
  ExpectBothFail("HTTP/1.1 200 OK\r\n" + std::string(2000, 'x'), "head larger");
  ExpectBothFail("HTTP/1.1 200 OK\r\n\r\ndata: " + std::string(3000, 'x'), "event larger");
  ExpectBothFail("", "closed the connection");
}

std::string Chunked(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  return size + data + "\r\n";
}

TEST(EpollSseClientTest, ReassemblesEventsAcrossChunks) {
  const std::string role =
      "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
  const std::string a = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
  const std::string b = "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n";
  FixedServer server("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" +
                     Chunked(role + a.substr(0, 20)) + Chunked(a.substr(20) + b) +
                     Chunked(": a comment\n\ndata: [DONE]\n\n") + "0\r\n\r\n");
  EpollSseClientOptions o;
  o.port = server.port();
  o.streams = 2;
  o.body = [](int) { return Body(3); };
  auto client = EpollSseClient::Create(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Run().ok());
  for (int i = 0; i < 2; ++i) {
    const EpollSseClient::Stream& s = (*client)->stream(i);
    EXPECT_TRUE(s.ok) << s.error;
    EXPECT_EQ(s.tokens, 2);  // not the role chunk
    EXPECT_EQ(s.event_bytes, static_cast<int64_t>(a.size()));
  }
}

TEST(EpollSseClientTest, RejectsBadOptions) {
  EpollSseClientOptions o;
  EXPECT_FALSE(EpollSseClient::Create(o).ok());
  o.port = 1;
  o.streams = 1;
  EXPECT_FALSE(EpollSseClient::Create(o).ok());  // no body
}

}  // namespace
}  // namespace ferry
