// Token streams (docs/design/token-streams.md) through real binaries: a ferry-router in front of a
// ferry-worker on the null engine (the default model's tokenizer, no weights).
//   - Many concurrent streams come through the worker's one token stream, coalesced (more than
//     one chunk per message), and every stream's token ids are those of the same request sent
//     through a router with --token_streams=false (each request on its own call), bit for bit.
//   - A client that stops reading does not hold up the others: it never reads a byte, yet the
//     other streams on the same token stream all finish, and its own request is cut off and
//     aborted on the worker (its buffer filled past --max_stream_buffer_bytes).

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

std::string g_router, g_worker, g_model;

// A connection to 127.0.0.1:port (a receive buffer of `rcvbuf` bytes when > 0), -1 on failure.
int Connect(int port, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string ChatRequest(int max_tokens, const std::string& content) {
  const std::string body = absl::StrCat(
      R"({"model":"smol","stream":true,"return_token_ids":true,"ignore_eos":true,"seed":7,"max_tokens":)",
      max_tokens, R"(,"messages":[{"role":"user","content":")", content, R"("}]})");
  return absl::StrCat("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                      "Content-Type: application/json\r\nConnection: close\r\nContent-Length: ",
                      body.size(), "\r\n\r\n", body);
}

// Sends a streaming chat completion and reads the whole answer (to the connection's close).
std::string StreamChat(int port, int max_tokens, const std::string& content) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  std::string out;
  if (SendAll(fd, ChatRequest(max_tokens, content))) {
    char buf[16384];
    while (true) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  return out;
}

// The token ids of a streamed answer's chunks, in order; whether it ended with [DONE].
std::vector<int64_t> TokenIds(const std::string& response, bool* done) {
  std::vector<int64_t> ids;
  *done = false;
  for (absl::string_view line : absl::StrSplit(response, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ")) continue;
    if (absl::StartsWith(line, "[DONE]")) {
      *done = true;
      continue;
    }
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("choices")) continue;
    for (const auto& c : j["choices"]) {
      if (!c.contains("token_ids") || !c["token_ids"].is_array()) continue;
      for (const auto& id : c["token_ids"]) ids.push_back(id.get<int64_t>());
    }
  }
  return ids;
}

class TokenStreamTest : public ::testing::Test {
 protected:
  std::unique_ptr<ServiceProcess> StartWorker(double token_seconds) {
    auto w = std::make_unique<ServiceProcess>(
        g_worker, std::vector<std::string>{"--model=" + g_model, "--engine=null",
                                           "--block_tokens=16", "--kv_pool_bytes=64MiB",
                                           absl::StrCat("--null_token_seconds=", token_seconds),
                                           "--max_running=64", "--max_batch_tokens=4096"});
    EXPECT_TRUE(w->ready()) << w->LogTail();
    return w;
  }
  std::unique_ptr<ServiceProcess> StartRouter(const ServiceProcess& worker,
                                              std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model=" + g_model, "--served_model_name=smol",
                                     "--workers=" + worker.address()};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = std::make_unique<ServiceProcess>(g_router, args);
    EXPECT_TRUE(r->ready()) << r->LogTail();
    return r;
  }
  // Waits until the router's requests stream through the token stream to its worker (it opens
  // when the router finds the worker up; a request before that streams on its own call): a short
  // request at a time until one's chunks came through the stream.
  void OpenStream(const ServiceProcess& router) {
    std::string answer;
    ASSERT_TRUE(WaitUntil([&] {
      answer = StreamChat(router.grpc_port(), 2, "warm up");
      return MetricValue(router.admin_port(),
                         "ferry_router_token_stream_chunks_total{delivered=\"true\"}") > 0;
    })) << answer
        << "\n"
        << router.LogTail();
  }
};

TEST_F(TokenStreamTest, ConcurrentStreamsAreCoalescedAndBitIdentical) {
  auto worker = StartWorker(0.002);
  auto muxed = StartRouter(*worker, {});
  auto plain = StartRouter(*worker, {"--token_streams=false"});
  OpenStream(*muxed);
  constexpr int kStreams = 16;
  constexpr int kTokens = 40;
  auto run = [&](const ServiceProcess& router) {
    std::vector<std::string> answers(kStreams);
    std::vector<std::thread> clients;
    for (int i = 0; i < kStreams; ++i) {
      clients.emplace_back([&, i] {
        answers[i] = StreamChat(router.grpc_port(), kTokens, absl::StrCat("question ", i));
      });
    }
    for (auto& t : clients) t.join();
    return answers;
  };
  const double messages_before =
      MetricValue(muxed->admin_port(), "ferry_router_token_stream_messages_total");
  const std::vector<std::string> via_stream = run(*muxed);
  const std::vector<std::string> via_calls = run(*plain);
  for (int i = 0; i < kStreams; ++i) {
    bool done_stream = false, done_calls = false;
    const std::vector<int64_t> a = TokenIds(via_stream[i], &done_stream);
    const std::vector<int64_t> b = TokenIds(via_calls[i], &done_calls);
    EXPECT_TRUE(done_stream) << via_stream[i].substr(0, 2000);
    EXPECT_TRUE(done_calls) << via_calls[i].substr(0, 2000);
    EXPECT_EQ(a.size(), static_cast<size_t>(kTokens)) << i;
    EXPECT_EQ(a, b) << "stream " << i;
  }
  // Through the token stream: every chunk delivered, several per message.
  const double messages =
      MetricValue(muxed->admin_port(), "ferry_router_token_stream_messages_total") -
      messages_before;
  const double delivered = MetricValue(
      muxed->admin_port(), "ferry_router_token_stream_chunks_total{delivered=\"true\"}");
  EXPECT_GE(delivered, kStreams * kTokens);
  EXPECT_GT(messages, 0);
  EXPECT_GT(delivered / std::max(messages, 1.0), 2.0)
      << delivered << " chunks in " << messages << " messages";
  EXPECT_EQ(MetricValue(plain->admin_port(), "ferry_router_token_stream_messages_total"), 0);
}

TEST_F(TokenStreamTest, ASlowReaderDoesNotHoldUpTheOthers) {
  auto worker = StartWorker(0.001);
  auto router = StartRouter(*worker, {"--max_stream_buffer_bytes=16KiB"});
  OpenStream(*router);
  // The slow client: a small receive buffer, and it never reads. Its stream's events fill the
  // kernel's buffers, then the router's 16 KiB, and it is cut off.
  const double before = MetricValue(router->admin_port(),
                                    "ferry_router_token_stream_chunks_total{delivered=\"true\"}");
  const int slow = Connect(router->grpc_port(), 4096);
  ASSERT_GE(slow, 0);
  ASSERT_TRUE(SendAll(slow, ChatRequest(6000, "never read")));
  // The slow request is on the worker (and so on the token stream) before the others start.
  ASSERT_TRUE(WaitUntil([&] {
    return MetricValue(router->admin_port(),
                       "ferry_router_token_stream_chunks_total{delivered=\"true\"}") > before + 10;
  })) << router->LogTail();
  constexpr int kOthers = 4;
  constexpr int kTokens = 300;
  std::vector<std::string> answers(kOthers);
  std::vector<std::thread> clients;
  for (int i = 0; i < kOthers; ++i) {
    clients.emplace_back([&, i] {
      answers[i] = StreamChat(router->grpc_port(), kTokens, absl::StrCat("other ", i));
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < kOthers; ++i) {
    bool done = false;
    EXPECT_EQ(TokenIds(answers[i], &done).size(), static_cast<size_t>(kTokens)) << i;
    EXPECT_TRUE(done) << answers[i].substr(0, 2000);
  }
  // The slow request was cut off and aborted on the worker (it asked for 6,000 tokens).
  EXPECT_TRUE(WaitUntil([&] {
    return MetricValue(worker->admin_port(),
                       "ferry_worker_requests_total{outcome=\"cancelled\"}") >= 1;
  })) << router->LogTail();
  close(slow);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: router_token_stream_test FERRY_ROUTER FERRY_WORKER\n");
    return 2;
  }
  ferry::g_router = argv[1];
  ferry::g_worker = argv[2];
  const char* model = std::getenv("FERRY_MODEL_GGUF");
  if (model == nullptr || *model == '\0') {
    std::fprintf(stderr, "router_token_stream_test: FERRY_MODEL_GGUF is not set\n");
    return 2;
  }
  ferry::g_model = model;
  return RUN_ALL_TESTS();
}
