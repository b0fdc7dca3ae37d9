// Remote image URLs through an in-process ferry-router with a fake ImageUrlFetcher (the seam of
// router/api/image_url_fetcher.h), in front of a real ferry-worker on the tiny VLM (made by
// router_image_fetch_test.sh): a remote image gives the same prompt and greedy tokens as the same
// bytes inline (the same content hash, placeholders and block hashes); the fetcher's refusals are
// the client's 4xx naming the part, fetched bytes that are not an image or are over
// --max_image_bytes are a 400; the fetch runs off the HTTP I/O thread (with one I/O thread, a text
// request is answered while a fetch blocks); a full fetch queue is a 503; counted in
// ferry_router_image_fetches_total. With the real fetcher (router/fetch, its test-only switch for
// loopback addresses) and an image server on 127.0.0.1: a URL the server answers with a redirect
// (to itself, or to 169.254.169.254) is a 400 in each API's error shape (chat, Messages,
// Responses) and the redirect is never followed; the server's image itself is fetched in each.
//
//   router_image_fetch_test FERRY_WORKER   (FERRY_TINY_VLM_DIR: the model)

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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
#include "router/fetch/remote_image_fetcher.h"
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
    o.image_url_fetcher = UrlFetcher();
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

  // The fetcher the router gets: the fake by default.
  virtual std::shared_ptr<ImageUrlFetcher> UrlFetcher() { return fetcher_; }

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

// A loopback HTTP/1.1 server on its own thread, one connection at a time: GET /cat.png answers the
// PNG, /redirect a 302 to its own /cat.png, /metadata a 302 to the cloud metadata address. It
// records every path asked.
class ImageServer {
 public:
  ImageServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(address);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
        listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      ADD_FAILURE() << "the image server cannot listen";
      return;
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ImageServer() {
    shutdown(fd_, SHUT_RDWR);  // accept returns an error: the thread ends
    if (thread_.joinable()) thread_.join();
    close(fd_);
  }

  std::string Url(const std::string& path) const {
    return absl::StrCat("http://127.0.0.1:", port_, path);
  }
  std::vector<std::string> paths() {
    absl::MutexLock lock(&mu_);
    return paths_;
  }

 private:
  void Serve() {
    for (;;) {
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos && request.size() < (64 << 10)) {
        const ssize_t n = recv(c, buffer, sizeof(buffer), 0);
        if (n <= 0) break;
        request.append(buffer, static_cast<size_t>(n));
      }
      const size_t start = request.find(' ') + 1;
      const std::string path = request.substr(start, request.find(' ', start) - start);
      {
        absl::MutexLock lock(&mu_);
        paths_.push_back(path);
      }
      std::string response;
      if (path == "/cat.png") {
        const std::string png = PngBytes();
        response = absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: ",
                                png.size(), "\r\nConnection: close\r\n\r\n", png);
      } else {
        const std::string to =
            path == "/redirect" ? Url("/cat.png") : "http://169.254.169.254/latest/meta-data";
        response = absl::StrCat("HTTP/1.1 302 Found\r\nLocation: ", to,
                                "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      }
      for (size_t sent = 0; sent < response.size();) {
        const ssize_t n = send(c, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
      close(c);
    }
  }

  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::vector<std::string> paths_ ABSL_GUARDED_BY(mu_);
};

// The router's fetcher over router/fetch's RemoteImageFetcher (as Router::Start makes it from
// --image_url_hosts), allowed to reach the loopback server.
class RealFetcher : public ImageUrlFetcher {
 public:
  explicit RealFetcher(std::unique_ptr<RemoteImageFetcher> fetcher)
      : fetcher_(std::move(fetcher)) {}
  absl::StatusOr<std::string> Fetch(const std::string& url, absl::Time deadline) override {
    return fetcher_->Fetch(url, deadline);
  }

 private:
  const std::unique_ptr<RemoteImageFetcher> fetcher_;
};

// One remote image and a question in each API: {target, body}.
std::vector<std::pair<std::string, nlohmann::json>> EachApi(const std::string& url) {
  const nlohmann::json text = {{"type", "text"}, {"text", "What is in this picture?"}};
  return {
      {"/v1/chat/completions", Chat(url)},
      {"/v1/messages",
       {{"model", "tiny"},
        {"max_tokens", 4},
        {"messages",
         {{{"role", "user"},
           {"content",
            {{{"type", "image"}, {"source", {{"type", "url"}, {"url", url}}}}, text}}}}}}},
      {"/v1/responses",
       {{"model", "tiny"},
        {"max_output_tokens", 4},
        {"store", false},
        {"input",
         {{{"role", "user"},
           {"content",
            {{{"type", "input_image"}, {"image_url", url}},
             {{"type", "input_text"}, {"text", "What is in this picture?"}}}}}}}}},
  };
}

class RouterRedirectTest : public RouterImageFetchTest {
 protected:
  std::shared_ptr<ImageUrlFetcher> UrlFetcher() override {
    RemoteImageFetcherOptions o;
    o.allowed_hosts = {"127.0.0.1"};
    o.max_image_bytes = 64 << 10;
    o.timeout = absl::Seconds(20);
    o.allow_private_addresses_for_tests = true;  // the server is on loopback
    auto fetcher = RemoteImageFetcher::Create(std::move(o));
    EXPECT_TRUE(fetcher.ok()) << fetcher.status();
    if (!fetcher.ok()) return nullptr;
    return std::make_shared<RealFetcher>(*std::move(fetcher));
  }

  ImageServer server_;
};

TEST_F(RouterRedirectTest, ARedirectIsA400InEachApiAndIsNeverFollowed) {
  for (const char* path : {"/redirect", "/metadata"}) {
    for (const auto& [target, body] : EachApi(server_.Url(path))) {
      SCOPED_TRACE(absl::StrCat(target, " ", path));
      const Reply r = Post(port(), target, body);
      EXPECT_EQ(r.status, 400) << r.body;
      const nlohmann::json& error = r.body["error"];
      if (target == "/v1/messages") {
        EXPECT_EQ(r.body["type"], "error") << r.body;
      }
      EXPECT_EQ(error["type"], "invalid_request_error") << r.body;
      EXPECT_NE(error["message"].get<std::string>().find("redirect"), std::string::npos) << r.body;
    }
  }
  // Each redirect asked once; neither target (its own /cat.png, the metadata address) followed.
  const std::vector<std::string> asked = server_.paths();
  EXPECT_EQ(asked, (std::vector<std::string>{"/redirect", "/redirect", "/redirect", "/metadata",
                                             "/metadata", "/metadata"}));
  // The stack still answers, and the same server's image is fetched in each API.
  for (const auto& [target, body] : EachApi(server_.Url("/cat.png"))) {
    const Reply r = Post(port(), target, body);
    EXPECT_EQ(r.status, 200) << target << " " << r.body;
  }
  EXPECT_EQ(server_.paths().size(), asked.size() + 3);
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
