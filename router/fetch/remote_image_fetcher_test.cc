// RemoteImageFetcher against real servers on 127.0.0.1: plain HTTP and HTTPS servers (Asio/Beast,
// a self-signed certificate made here with OpenSSL), and dnsmasq for names. Fetches that must
// succeed run with allow_private_addresses_for_tests (the server is on loopback); the address
// refusals run without it and check that the listening server was never connected to.

#include "router/fetch/remote_image_fetcher.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "boost/asio.hpp"
#include "boost/asio/ssl.hpp"
#include "gtest/gtest.h"
#include "services/common/testing/dnsmasq.h"

namespace ferry {
namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
using asio::ip::tcp;

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// A self-signed certificate (EC P-256) for `names` ("DNS:fetch.test,IP:127.0.0.1"), written as
// PEM files; the certificate is its own CA (the test's ca_file).
struct TestCert {
  std::string cert_file, key_file;
};

TestCert MakeCert(const std::string& names, const std::string& tag) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("ferry test"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  for (const auto& [nid, value] : std::vector<std::pair<int, std::string>>{
           {NID_basic_constraints, "critical,CA:TRUE"}, {NID_subject_alt_name, names}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(x, key, EVP_sha256());
  TestCert out{absl::StrCat(TempDir(), "/", tag, "_cert.pem"),
               absl::StrCat(TempDir(), "/", tag, "_key.pem")};
  FILE* f = std::fopen(out.cert_file.c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen(out.key_file.c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
  return out;
}

// An HTTP(S) server on 127.0.0.1, port 0, on its own thread: every connection is counted; it
// reads the request head and writes `response` (then closes), or, silent, holds the connection
// and never answers.
class TestServer {
 public:
  enum class Mode { kRespond, kSilent };

  TestServer(std::string response, Mode mode = Mode::kRespond, const TestCert* cert = nullptr)
      : response_(std::move(response)), mode_(mode), acceptor_(io_) {
    if (cert != nullptr) {
      tls_ = std::make_unique<ssl::context>(ssl::context::tls_server);
      tls_->use_certificate_chain_file(cert->cert_file);
      tls_->use_private_key_file(cert->key_file, ssl::context::pem);
    }
    const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
  }
  ~TestServer() {
    io_.stop();
    thread_.join();
  }

  int port() const { return port_; }
  int accepts() const { return accepts_.load(); }
  std::string last_request() {
    absl::MutexLock lock(&mu_);
    return last_request_;
  }

 private:
  void Accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) return;
      ++accepts_;
      if (mode_ == Mode::kSilent) {
        held_.push_back(std::make_shared<tcp::socket>(std::move(socket)));
      } else if (tls_ != nullptr) {
        auto stream = std::make_shared<ssl::stream<tcp::socket>>(std::move(socket), *tls_);
        stream->async_handshake(ssl::stream_base::server,
                                [this, stream](boost::system::error_code e) {
                                  if (!e) Serve(stream);
                                });
      } else {
        Serve(std::make_shared<tcp::socket>(std::move(socket)));
      }
      Accept();
    });
  }

  template <typename Stream>
  void Serve(std::shared_ptr<Stream> stream) {
    auto buf = std::make_shared<asio::streambuf>(64 << 10);
    asio::async_read_until(*stream, *buf, "\r\n\r\n",
                           [this, stream, buf](boost::system::error_code ec, size_t n) {
                             if (ec) return;
                             {
                               absl::MutexLock lock(&mu_);
                               last_request_.assign(asio::buffers_begin(buf->data()),
                                                    asio::buffers_begin(buf->data()) + n);
                             }
                             asio::async_write(*stream, asio::buffer(response_),
                                               [stream](boost::system::error_code, size_t) {
                                                 boost::system::error_code ignored;
                                                 asio::ip::tcp::socket& s = LowestSocket(*stream);
                                                 s.shutdown(tcp::socket::shutdown_send, ignored);
                                               });
                           });
  }

  static tcp::socket& LowestSocket(tcp::socket& s) { return s; }
  static tcp::socket& LowestSocket(ssl::stream<tcp::socket>& s) { return s.next_layer(); }

  const std::string response_;
  const Mode mode_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  std::unique_ptr<ssl::context> tls_;
  std::vector<std::shared_ptr<tcp::socket>> held_;
  std::atomic<int> accepts_{0};
  int port_ = 0;
  std::thread thread_;
  absl::Mutex mu_;
  std::string last_request_ ABSL_GUARDED_BY(mu_);
};

// Binary bytes that look like nothing HTTP would keep intact by accident.
std::string ImageBytes(size_t n) {
  std::string out = "\x89PNG\r\n\x1a\n";
  out.push_back('\0');
  for (size_t i = out.size(); i < n; ++i) out.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  out.resize(n);
  return out;
}

std::string Response(const std::string& head, const std::string& body) {
  return absl::StrCat(head, "\r\n\r\n", body);
}

std::string Ok(const std::string& body, const std::string& type = "image/png") {
  return Response(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: ", type,
                               "\r\nContent-Length: ", body.size(), "\r\nConnection: close"),
                  body);
}

class RemoteImageFetcherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dns_ = new Dnsmasq(
        "127.0.0.1 fetch.test other.test evil.test\n"
        "8.8.8.8 mixed.test\n127.0.0.1 mixed.test\n"
        "169.254.169.254 metadata.test\n"
        "::1 v6loop.test\n");
    const absl::Status s = dns_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    delete dns_;
    dns_ = nullptr;
  }

  // Options that fetch from loopback: the test override on, names through dnsmasq.
  RemoteImageFetcherOptions TestOptions() const {
    RemoteImageFetcherOptions o;
    o.allowed_hosts = {"127.0.0.1", "fetch.test", "other.test"};
    o.dns_servers = {dns_->server()};
    o.allow_private_addresses_for_tests = true;
    o.timeout = absl::Seconds(20);
    return o;
  }

  absl::StatusOr<std::string> Fetch(const RemoteImageFetcherOptions& options,
                                    const std::string& url,
                                    absl::Time deadline = absl::InfiniteFuture()) {
    auto fetcher = RemoteImageFetcher::Create(options);
    if (!fetcher.ok()) return fetcher.status();
    return (*fetcher)->Fetch(url, deadline);
  }

  static std::string Url(const TestServer& s, const std::string& host = "127.0.0.1",
                         const std::string& scheme = "http") {
    return absl::StrCat(scheme, "://", host, ":", s.port(), "/img/cat.png?v=1");
  }

  static Dnsmasq* dns_;
};

Dnsmasq* RemoteImageFetcherTest::dns_ = nullptr;

#define EXPECT_REFUSED(result, want_code, text)                                          \
  do {                                                                                   \
    const auto& r_ = (result);                                                           \
    ASSERT_FALSE(r_.ok()) << "fetched " << r_->size() << " bytes";                       \
    EXPECT_EQ(r_.status().code(), (want_code)) << r_.status();                           \
    EXPECT_NE(r_.status().message().find(text), absl::string_view::npos) << r_.status(); \
  } while (0)

TEST_F(RemoteImageFetcherTest, FetchesTheImageByteExact) {
  const std::string image = ImageBytes(100000);
  TestServer server(Ok(image));
  auto got = Fetch(TestOptions(), Url(server));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, image);
  // Through a name: the Host header carries it, and the request is a plain GET.
  got = Fetch(TestOptions(), Url(server, "fetch.test"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, image);
  const std::string request = server.last_request();
  EXPECT_EQ(request.rfind("GET /img/cat.png?v=1 HTTP/1.1\r\n", 0), 0u) << request;
  EXPECT_NE(request.find(absl::StrCat("Host: fetch.test:", server.port(), "\r\n")),
            std::string::npos)
      << request;
  EXPECT_EQ(request.find("Accept-Encoding"), std::string::npos) << request;
  EXPECT_EQ(server.accepts(), 2);
}

TEST_F(RemoteImageFetcherTest, TakesImageTypesAndOctetStreamAsConfigured) {
  const std::string image = ImageBytes(300);
  TestServer jpeg(Ok(image, "IMAGE/JPEG; charset=binary"));
  EXPECT_TRUE(Fetch(TestOptions(), Url(jpeg)).ok());
  TestServer octet(Ok(image, "application/octet-stream"));
  EXPECT_TRUE(Fetch(TestOptions(), Url(octet)).ok());
  RemoteImageFetcherOptions strict = TestOptions();
  strict.accept_octet_stream = false;
  EXPECT_REFUSED(Fetch(strict, Url(octet)), absl::StatusCode::kInvalidArgument, "not an image");
  TestServer html(Ok("<html></html>", "text/html"));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(html)), absl::StatusCode::kInvalidArgument,
                 "Content-Type 'text/html', not an image");
  TestServer bare(Ok(image, "image/"));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(bare)), absl::StatusCode::kInvalidArgument,
                 "not an image");
  TestServer untyped(
      Response(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", image.size()), image));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(untyped)), absl::StatusCode::kInvalidArgument,
                 "not an image");
  TestServer gzip(Response(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n"
                                        "Content-Encoding: gzip\r\nContent-Length: ",
                                        image.size()),
                           image));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(gzip)), absl::StatusCode::kInvalidArgument,
                 "Content-Encoding (gzip)");
}

TEST_F(RemoteImageFetcherTest, RefusesRedirectsAndErrors) {
  TestServer redirect(
      Response("HTTP/1.1 302 Found\r\nLocation: http://169.254.169.254/latest/meta-data/\r\n"
               "Content-Length: 0",
               ""));
  auto got = Fetch(TestOptions(), Url(redirect));
  EXPECT_REFUSED(got, absl::StatusCode::kInvalidArgument, "answered HTTP 302 (a redirect)");
  EXPECT_EQ(got.status().message().find("169.254"), absl::string_view::npos);
  EXPECT_EQ(redirect.accepts(), 1);  // and nothing else was asked
  TestServer moved(Response("HTTP/1.1 301 Moved\r\nLocation: /b.png\r\nContent-Length: 0", ""));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(moved)), absl::StatusCode::kInvalidArgument, "301");
  TestServer missing(Response("HTTP/1.1 404 Not Found\r\nContent-Length: 0", ""));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(missing)), absl::StatusCode::kInvalidArgument,
                 "answered HTTP 404");
  TestServer empty(Ok(""));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(empty)), absl::StatusCode::kInvalidArgument,
                 "sent no bytes");
  TestServer garbage("SSH-2.0-OpenSSH_9.2\r\n\r\n");
  EXPECT_REFUSED(Fetch(TestOptions(), Url(garbage)), absl::StatusCode::kInvalidArgument,
                 "not valid HTTP/1.1");
}

TEST_F(RemoteImageFetcherTest, StopsAtTheSizeCap) {
  RemoteImageFetcherOptions options = TestOptions();
  options.max_image_bytes = 1000;
  const std::string at_cap = ImageBytes(1000);
  const std::string over = ImageBytes(200000);
  TestServer exact(Ok(at_cap));
  auto got = Fetch(options, Url(exact));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, at_cap);
  // Content-Length over the cap: refused before the body.
  TestServer declared(Ok(over));
  EXPECT_REFUSED(Fetch(options, Url(declared)), absl::StatusCode::kInvalidArgument,
                 "over the limit of 1000 bytes");
  // No Content-Length, the body until the connection closes: the read stops at the cap.
  TestServer to_eof(
      Response("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close", over));
  EXPECT_REFUSED(Fetch(options, Url(to_eof)), absl::StatusCode::kInvalidArgument,
                 "over the limit of 1000 bytes");
  // Chunked: the same.
  std::string chunked;
  for (int i = 0; i < 20; ++i) chunked += absl::StrCat("64\r\n", std::string(100, 'x'), "\r\n");
  chunked += "0\r\n\r\n";
  TestServer chunks(Response(
      "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked", chunked));
  EXPECT_REFUSED(Fetch(options, Url(chunks)), absl::StatusCode::kInvalidArgument,
                 "over the limit of 1000 bytes");
  // A Content-Length the server does not keep.
  TestServer short_body(Response(
      "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: 900", at_cap.substr(0, 10)));
  EXPECT_REFUSED(Fetch(options, Url(short_body)), absl::StatusCode::kInvalidArgument,
                 "closed before the answer was complete");
}

TEST_F(RemoteImageFetcherTest, CapsTheHeaders) {
  RemoteImageFetcherOptions options = TestOptions();
  options.max_header_bytes = 1024;
  TestServer big(Response(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nX-Pad: ",
                                       std::string(4000, 'p'), "\r\nContent-Length: 3"),
                          "abc"));
  EXPECT_REFUSED(Fetch(options, Url(big)), absl::StatusCode::kInvalidArgument,
                 "headers are over 1024 bytes");
}

TEST_F(RemoteImageFetcherTest, ASilentServerMeetsTheDeadline) {
  TestServer silent("", TestServer::Mode::kSilent);
  RemoteImageFetcherOptions options = TestOptions();
  options.timeout = absl::Milliseconds(300);
  // The fetcher's own timeout: a 400 for the client.
  EXPECT_REFUSED(Fetch(options, Url(silent)), absl::StatusCode::kInvalidArgument,
                 "did not answer within 300ms (reading the response headers)");
  // The caller's deadline, earlier: DeadlineExceeded.
  options.timeout = absl::Seconds(30);
  EXPECT_REFUSED(Fetch(options, Url(silent), absl::Now() + absl::Milliseconds(300)),
                 absl::StatusCode::kDeadlineExceeded, "deadline passed");
  // HTTPS: the handshake is bounded the same way.
  options.timeout = absl::Milliseconds(300);
  EXPECT_REFUSED(Fetch(options, Url(silent, "127.0.0.1", "https")),
                 absl::StatusCode::kInvalidArgument, "(TLS handshake)");
  EXPECT_EQ(silent.accepts(), 3);
  // A deadline already past: nothing is asked.
  TestServer other(Ok("x"));
  EXPECT_REFUSED(Fetch(TestOptions(), Url(other), absl::Now() - absl::Seconds(1)),
                 absl::StatusCode::kDeadlineExceeded, "deadline");
  EXPECT_EQ(other.accepts(), 0);
}

TEST_F(RemoteImageFetcherTest, RefusesNonPublicAddressesBeforeConnecting) {
  TestServer server(Ok(ImageBytes(100)));
  RemoteImageFetcherOptions options;
  options.allowed_hosts = {"127.0.0.1",        "localhost",  "::1",         "169.254.169.254",
                           "evil.test",        "mixed.test", "v6loop.test", "metadata.test",
                           "::ffff:127.0.0.1", "10.1.2.3",   "a.localhost"};
  options.dns_servers = {dns_->server()};
  const std::string port = absl::StrCat(":", server.port());
  const struct {
    std::string url;
    const char* why;
  } cases[] = {
      {"http://127.0.0.1" + port + "/a.png", "'127.0.0.1' is a loopback address"},
      {"http://localhost" + port + "/a.png", "'localhost' is a loopback name"},
      {"http://a.localhost" + port + "/a.png", "loopback name"},
      {"http://[::1]" + port + "/a.png", "'::1' is a loopback address"},
      {"http://[::ffff:127.0.0.1]" + port + "/a.png", "is a loopback address"},
      {"http://169.254.169.254/latest/meta-data/", "is a link-local address"},
      {"http://10.1.2.3/a.png", "is a private address"},
      {"http://evil.test" + port + "/a.png", "'evil.test' resolves to a loopback address"},
      {"http://EVIL.test." + port + "/a.png", "resolves to a loopback address"},
      {"http://mixed.test" + port + "/a.png", "resolves to a loopback address"},
      {"http://v6loop.test" + port + "/a.png", "resolves to a loopback address"},
      {"http://metadata.test/a.png", "resolves to a link-local address"},
  };
  for (const auto& c : cases) {
    auto got = Fetch(options, c.url);
    EXPECT_REFUSED(got, absl::StatusCode::kPermissionDenied, c.why);
    // The message names the class, not the address a name resolved to.
    if (c.url.find(".test") != std::string::npos) {
      EXPECT_EQ(got.status().message().find("127.0"), absl::string_view::npos) << got.status();
      EXPECT_EQ(got.status().message().find("169.254"), absl::string_view::npos) << got.status();
    }
  }
  // Numeric forms other parsers read as 127.0.0.1 are not even parsed.
  for (const char* url : {"http://2130706433/", "http://0x7f.1/", "http://127.1/",
                          "http://0177.0.0.1/", "http://0x7f000001/"}) {
    EXPECT_REFUSED(Fetch(options, url), absl::StatusCode::kInvalidArgument, "canonical");
  }
  EXPECT_EQ(server.accepts(), 0);
}

TEST_F(RemoteImageFetcherTest, RefusesHostsOffTheAllowlist) {
  TestServer server(Ok(ImageBytes(100)));
  RemoteImageFetcherOptions options = TestOptions();
  options.allowed_hosts = {"*.images.test"};
  EXPECT_REFUSED(Fetch(options, Url(server, "fetch.test")), absl::StatusCode::kPermissionDenied,
                 "'fetch.test' is not on this server's list of allowed image hosts");
  EXPECT_REFUSED(Fetch(options, Url(server)), absl::StatusCode::kPermissionDenied,
                 "not on this server's list");
  options.allowed_hosts = {};
  EXPECT_REFUSED(Fetch(options, Url(server, "fetch.test")), absl::StatusCode::kPermissionDenied,
                 "remote image URLs are not enabled");
  EXPECT_REFUSED(Fetch(options, "ftp://fetch.test/a.png"), absl::StatusCode::kInvalidArgument,
                 "scheme");
  options.allowed_hosts = {"nowhere.test"};
  EXPECT_REFUSED(Fetch(options, "http://nowhere.test/a.png"), absl::StatusCode::kInvalidArgument,
                 "'nowhere.test' does not resolve");
  EXPECT_EQ(server.accepts(), 0);
}

TEST_F(RemoteImageFetcherTest, Https) {
  const TestCert cert = MakeCert("DNS:fetch.test,IP:127.0.0.1", "https");
  const std::string image = ImageBytes(50000);
  TestServer server(Ok(image), TestServer::Mode::kRespond, &cert);
  RemoteImageFetcherOptions options = TestOptions();
  options.ca_file = cert.cert_file;
  auto got = Fetch(options, Url(server, "fetch.test", "https"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, image);
  EXPECT_NE(server.last_request().find(absl::StrCat("Host: fetch.test:", server.port())),
            std::string::npos);
  // An IP literal is checked against the certificate's IP names.
  got = Fetch(options, Url(server, "127.0.0.1", "https"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, image);
  // The name resolves to the same server, but the certificate is not for it.
  EXPECT_REFUSED(Fetch(options, Url(server, "other.test", "https")),
                 absl::StatusCode::kInvalidArgument, "TLS certificate is refused (hostname");
  // Without the test CA (the system bundle): not trusted.
  RemoteImageFetcherOptions system_ca = TestOptions();
  EXPECT_REFUSED(Fetch(system_ca, Url(server, "fetch.test", "https")),
                 absl::StatusCode::kInvalidArgument, "TLS certificate is refused");
  // Another self-signed certificate as the CA: not trusted either.
  const TestCert stranger = MakeCert("DNS:fetch.test", "stranger");
  RemoteImageFetcherOptions wrong_ca = TestOptions();
  wrong_ca.ca_file = stranger.cert_file;
  EXPECT_REFUSED(Fetch(wrong_ca, Url(server, "fetch.test", "https")),
                 absl::StatusCode::kInvalidArgument, "TLS certificate is refused");
  // Plain HTTP to a TLS server is not an image either.
  EXPECT_FALSE(Fetch(options, Url(server, "fetch.test", "http")).ok());
}

TEST_F(RemoteImageFetcherTest, CreateChecksItsOptions) {
  RemoteImageFetcherOptions options = TestOptions();
  options.ca_file = "/nonexistent/ca.pem";
  EXPECT_EQ(RemoteImageFetcher::Create(options).status().code(),
            absl::StatusCode::kFailedPrecondition);
  options = TestOptions();
  options.allowed_hosts = {"*.com"};
  EXPECT_EQ(RemoteImageFetcher::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = TestOptions();
  options.dns_servers = {"dns.example.com"};
  EXPECT_EQ(RemoteImageFetcher::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = TestOptions();
  options.max_image_bytes = 0;
  EXPECT_EQ(RemoteImageFetcher::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = TestOptions();
  options.timeout = absl::ZeroDuration();
  EXPECT_EQ(RemoteImageFetcher::Create(options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RemoteImageFetcherTest, ConcurrentFetchesShareOneFetcher) {
  const std::string image = ImageBytes(20000);
  TestServer server(Ok(image));
  auto fetcher = RemoteImageFetcher::Create(TestOptions());
  ASSERT_TRUE(fetcher.ok());
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        auto got = (*fetcher)->Fetch(Url(server, "fetch.test"), absl::InfiniteFuture());
        if (got.ok() && *got == image) ++good;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(good.load(), 40);
  EXPECT_EQ(server.accepts(), 40);
}

}  // namespace
}  // namespace ferry
