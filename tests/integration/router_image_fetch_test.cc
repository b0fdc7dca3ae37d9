// Remote image URLs through an in-process ferry-router with a fake ImageUrlFetcher (the seam of
// router/api/image_url_fetcher.h), in front of a real ferry-worker on the tiny VLM (made by
// router_image_fetch_test.sh): a remote image gives the same prompt and greedy tokens as the same
// bytes inline (the same content hash, placeholders and block hashes); the fetcher's refusals are
// the client's 4xx naming the part, fetched bytes that are not an image or are over
// --max_image_bytes are a 400; the fetch runs off the HTTP I/O thread (with one I/O thread, a text
// request is answered while a fetch blocks); a full fetch queue is a 503; counted in
// ferry_router_image_fetches_total.
//
//   router_image_fetch_test FERRY_WORKER   (FERRY_TINY_VLM_DIR: the model)

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/router.h"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string g_worker;

// A 2x2 RGB PNG (Python's zlib).
constexpr char kPng[] =
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGNocFAAIgYIBQAaDgOBnA45xwAAAABJRU5Er"
    "kJggg==";

std::string PngBytes() {
  std::string bytes;
  absl::Base64Unescape(kPng, &bytes);
  return bytes;
}

struct Reply {
  int status = -1;
  nlohmann::json body;
};

Reply Post(int port, const std::string& target, const nlohmann::json& body) {
  asio::io_context io;
  tcp::socket socket(io);
  beast::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  Reply reply;
  if (ec) return reply;
  http::request<http::string_body> request(http::verb::post, target, 11);
  request.set(http::field::host, "127.0.0.1");
  request.set(http::field::content_type, "application/json");
  request.set("anthropic-version", "2023-06-01");
  request.body() = body.dump();
  request.prepare_payload();
  http::write(socket, request, ec);
  if (ec) return reply;
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(socket, buffer, response, ec);
  if (ec) return reply;
  reply.status = response.result_int();
  reply.body = nlohmann::json::parse(response.body(), nullptr, false);
  return reply;
}

// Serves URLs from a map; "https://slow/..." blocks until released (and says it entered).
class FakeFetcher : public ImageUrlFetcher {
 public:
  explicit FakeFetcher(std::map<std::string, std::string> images) : images_(std::move(images)) {}

  absl::StatusOr<std::string> Fetch(const std::string& url, absl::Time deadline) override {
    EXPECT_GT(deadline, absl::Now());
    if (url.rfind("https://slow/", 0) == 0) {
      if (!entered_.HasBeenNotified()) entered_.Notify();
      release_.WaitForNotification();
    }
    auto it = images_.find(url);
    if (it == images_.end()) {
      return absl::PermissionDeniedError("host not in --image_url_hosts");
    }
    return it->second;
  }

  absl::Notification& entered() { return entered_; }
  void Release() {  // once (the test, then TearDown)
    absl::MutexLock lock(&mu_);
    if (!release_.HasBeenNotified()) release_.Notify();
  }

 private:
  const std::map<std::string, std::string> images_;
  absl::Notification entered_;
  absl::Mutex mu_;
  absl::Notification release_;
};

nlohmann::json Chat(const std::string& url) {
  return {{"model", "tiny"},
          {"max_tokens", 6},
          {"temperature", 0},
          {"return_token_ids", true},
          {"messages",
           {{{"role", "user"},
             {"content",
              {{{"type", "image_url"}, {"image_url", {{"url", url}}}},
               {{"type", "text"}, {"text", "What is in this picture?"}}}}}}}};
}

class RouterImageFetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* model = std::getenv("FERRY_TINY_VLM_DIR");
    ASSERT_NE(model, nullptr) << "FERRY_TINY_VLM_DIR is not set: run router_image_fetch_test.sh";
    worker_ = std::make_unique<ServiceProcess>(
        g_worker, std::vector<std::string>{absl::StrCat("--model=", model), "--block_tokens=16",
                                           "--threads=1", "--kv_pool_bytes=8MiB"});
    ASSERT_TRUE(worker_->ready()) << worker_->LogTail();
    fetcher_ = std::make_shared<FakeFetcher>(std::map<std::string, std::string>{
        {"https://images.example/cat.png", PngBytes()},
        {"https://slow/cat.png", PngBytes()},
        {"https://images.example/text.png", "not an image at all"},
        {"https://images.example/big.png", PngBytes() + std::string(80 << 10, 'x')}});
    RouterOptions o;
    o.model = model;
    o.served_model_name = "tiny";
    o.workers = {absl::StrCat("127.0.0.1:", worker_->grpc_port())};
    o.http.threads = 1;  // one I/O thread: a blocking fetch there would stall every request
    o.max_image_bytes = 64 << 10;
    o.image_url_fetcher = fetcher_;
    o.image_fetch_threads = 1;
    // A call answers its client before its fetch task ends: requests one after another may find
    // the thread still busy, and wait.
    o.max_queued_image_fetches = max_queued_;
    auto router = Router::Start(o);
    ASSERT_TRUE(router.ok()) << router.status();
    router_ = *std::move(router);
    // /readyz: 200 once it watches a worker that is up.
    ASSERT_TRUE(WaitUntil([&] { return HttpGet(router_->admin_port(), "/readyz") == 200; }));
  }

  void TearDown() override {
    if (fetcher_ != nullptr) fetcher_->Release();  // nothing may stay blocked
    router_.reset();
  }

  int port() const { return router_->http_port(); }

  double Fetches(const std::string& result) {
    std::string page;
    HttpGet(router_->admin_port(), "/metrics", &page);
    const std::string key = "ferry_router_image_fetches_total{result=\"" + result + "\"} ";
    const size_t at = page.find(key);
    return at == std::string::npos ? 0 : std::stod(page.substr(at + key.size()));
  }

  int64_t max_queued_ = 4;
  std::unique_ptr<ServiceProcess> worker_;
  std::shared_ptr<FakeFetcher> fetcher_;
  std::unique_ptr<Router> router_;
};

TEST_F(RouterImageFetchTest, ARemoteImageIsTheSameAsItsBytesInline) {
  const Reply inline_reply =
      Post(port(), "/v1/chat/completions", Chat(absl::StrCat("data:image/png;base64,", kPng)));
  ASSERT_EQ(inline_reply.status, 200) << inline_reply.body;
  const Reply remote = Post(port(), "/v1/chat/completions", Chat("https://images.example/cat.png"));
  ASSERT_EQ(remote.status, 200) << remote.body;
  const nlohmann::json& a = inline_reply.body["choices"][0];
  const nlohmann::json& b = remote.body["choices"][0];
  EXPECT_EQ(a["prompt_token_ids"], b["prompt_token_ids"]);
  EXPECT_EQ(a["token_ids"], b["token_ids"]);
  EXPECT_EQ(a["message"]["content"], b["message"]["content"]);
  // The same bytes, so the same block hashes: the remote request reuses the inline one's blocks.
  const int64_t n = remote.body["usage"]["prompt_tokens"];
  EXPECT_EQ(remote.body["usage"]["prompt_tokens_details"]["cached_tokens"], (n - 1) / 16 * 16);
  EXPECT_EQ(Fetches("ok"), 1);
}

TEST_F(RouterImageFetchTest, RefusalsAreTheClientsAnswer) {
  Reply r = Post(port(), "/v1/chat/completions", Chat("https://elsewhere.example/cat.png"));
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_EQ(r.body["error"]["param"], "messages[0].content[0].image_url");
  EXPECT_EQ(r.body["error"]["code"], "image_fetch_failed");
  r = Post(port(), "/v1/chat/completions", Chat("https://images.example/text.png"));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.body["error"]["code"], "invalid_image");
  r = Post(port(), "/v1/chat/completions", Chat("https://images.example/big.png"));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.body["error"]["code"], "image_too_large");
  // Anthropic's url source, in its error shape.
  nlohmann::json m = {
      {"model", "tiny"},
      {"max_tokens", 4},
      {"messages",
       {{{"role", "user"},
         {"content",
          {{{"type", "image"},
            {"source", {{"type", "url"}, {"url", "https://elsewhere.example/x.png"}}}}}}}}}};
  r = Post(port(), "/v1/messages", m);
  EXPECT_EQ(r.status, 403) << r.body;
  EXPECT_EQ(r.body["type"], "error");
  // Refused by the fetcher (twice) or over the size; the non-image was fetched (ok).
  EXPECT_EQ(Fetches("error"), 3);
  // The stack still answers.
  EXPECT_EQ(Post(port(), "/v1/chat/completions", Chat("https://images.example/cat.png")).status,
            200);
}

// No queue: the one thread busy, the next remote image is a 503.
class RouterImageFetchQueueTest : public RouterImageFetchTest {
 protected:
  RouterImageFetchQueueTest() { max_queued_ = 0; }
};

TEST_F(RouterImageFetchQueueTest, FetchesRunOffTheIoThreadAndTheirQueueIsBounded) {
  Reply slow;
  std::thread client(
      [&] { slow = Post(port(), "/v1/chat/completions", Chat("https://slow/cat.png")); });
  fetcher_->entered().WaitForNotification();  // the one fetch thread is blocked
  // The one I/O thread still answers a text request...
  const Reply text = Post(port(), "/v1/chat/completions",
                          {{"model", "tiny"},
                           {"max_tokens", 2},
                           {"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  EXPECT_EQ(text.status, 200) << text.body;
  // ... and refuses another remote image: no queue room.
  const Reply full = Post(port(), "/v1/chat/completions", Chat("https://images.example/cat.png"));
  EXPECT_EQ(full.status, 503) << full.body;
  EXPECT_EQ(Fetches("queue_full"), 1);
  fetcher_->Release();
  client.join();
  EXPECT_EQ(slow.status, 200) << slow.body;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FERRY_WORKER\n", argv[0]);
    return 2;
  }
  ferry::g_worker = argv[1];
  return RUN_ALL_TESTS();
}
