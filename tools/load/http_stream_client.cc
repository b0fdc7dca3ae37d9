#include "tools/load/http_stream_client.h"

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "services/common/host_port.h"
#include "services/common/http_get.h"

namespace ferry {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

std::chrono::nanoseconds ToChrono(absl::Duration d) {
  return std::chrono::nanoseconds(absl::ToInt64Nanoseconds(d));
}

struct Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  beast::flat_buffer buffer;
};

}  // namespace

absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url) {
  absl::string_view rest = url;
  if (absl::StartsWith(rest, "https://")) {
    return absl::InvalidArgumentError(absl::StrCat("https is not supported: ", url));
  }
  if (absl::StartsWith(rest, "http://")) rest.remove_prefix(7);
  HttpUrl out;
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  if (slash != absl::string_view::npos) {
    out.path = std::string(rest.substr(slash));
    while (!out.path.empty() && out.path.back() == '/') out.path.pop_back();
  }
  absl::string_view host = authority;
  if (absl::StartsWith(authority, "[")) {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("bad host in ", url));
    }
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') {
        return absl::InvalidArgumentError(absl::StrCat("bad host in ", url));
      }
      out.port = std::string(authority.substr(close + 2));
    }
  } else if (const size_t colon = authority.rfind(':'); colon != absl::string_view::npos) {
    host = authority.substr(0, colon);
    out.port = std::string(authority.substr(colon + 1));
  }
  int port = 0;
  if (host.empty() || !absl::SimpleAtoi(out.port, &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("not an http://host:port URL: ", url));
  }
  out.host = std::string(host);
  return out;
}

absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout) {
  auto parsed = ParseHttpUrl(url);
  if (!parsed.ok()) return parsed.status();
  int port = 0;
  absl::SimpleAtoi(parsed->port, &port);  // ParseHttpUrl checked it
  HttpGetOptions options;
  options.user_agent = "ferry-load";
  return ferry::HttpGet(JoinHostPort(parsed->host, port), parsed->path.empty() ? "/" : parsed->path,
                        absl::Now() + timeout, options);
}

class HttpStreamClient::Impl {
 public:
  Impl(asio::io_context* io, HttpUrl url, tcp::resolver::results_type endpoints, int max_idle)
      : io(*io), url(std::move(url)), endpoints(std::move(endpoints)), max_idle(max_idle) {}

  asio::io_context& io;
  const HttpUrl url;
  const tcp::resolver::results_type endpoints;
  const int max_idle;
  std::vector<std::unique_ptr<Connection>> idle;
  int64_t opened = 0, retries = 0;
};

namespace {

// One request: a connection (kept-alive or new), the write, the header, the body as it arrives.
// Owned by the handlers it has pending (shared_ptr); ends when on_done has run.
class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(std::shared_ptr<HttpStreamClient::Impl> client, http::request<http::string_body> request,
       absl::Duration timeout, HttpStreamClient::Callbacks callbacks)
      : client_(std::move(client)),
        request_(std::move(request)),
        timeout_(timeout),
        callbacks_(std::move(callbacks)),
        timer_(client_->io) {}

  void Start() {
    timer_.expires_after(ToChrono(timeout_));
    timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->Expire();
    });
    Acquire(/*fresh=*/false);
  }

 private:
  void Acquire(bool fresh) {
    if (!fresh && !client_->idle.empty()) {
      connection_ = std::move(client_->idle.back());
      client_->idle.pop_back();
      reused_ = true;
      Write();
      return;
    }
    reused_ = false;
    connection_ = std::make_unique<Connection>(client_->io);
    ++client_->opened;
    asio::async_connect(connection_->socket, client_->endpoints,
                        [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
                          if (ec) return self->Fail(ec, "connect");
                          self->connection_->socket.set_option(tcp::no_delay(true), ec);
                          self->Write();
                        });
  }

  void Write() {
    http::async_write(connection_->socket, request_,
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->Fail(ec, "write");
                        self->ReadHeader();
                      });
  }

  void ReadHeader() {
    parser_.emplace();
    // No limit (a stream is as long as it is). Not boost::none: Boost 1.74 compares a
    // Content-Length against an empty optional as if it were exceeded.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    http::async_read_header(connection_->socket, connection_->buffer, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->Fail(ec, "read");
                              self->header_seen_ = true;
                              if (self->callbacks_.on_header) {
                                self->callbacks_.on_header(self->parser_->get().result_int());
                              }
                              self->ReadBody();
                            });
  }

  void ReadBody() {
    if (done_) return;
    if (parser_->is_done()) return Finish();
    parser_->get().body().data = buffer_;
    parser_->get().body().size = sizeof(buffer_);
    http::async_read_some(connection_->socket, connection_->buffer, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec == http::error::need_buffer) ec = {};
                            const size_t got =
                                sizeof(self->buffer_) - self->parser_->get().body().size;
                            if (got > 0 && !self->done_ && self->callbacks_.on_body) {
                              self->callbacks_.on_body(absl::string_view(self->buffer_, got));
                            }
                            if (ec == http::error::end_of_stream && self->parser_->is_done())
                              ec = {};
                            if (ec) return self->Fail(ec, "read");
                            self->ReadBody();
                          });
  }

  void Finish() {
    if (done_) return;
    const bool keep = parser_->keep_alive() && connection_->buffer.size() == 0 &&
                      static_cast<int>(client_->idle.size()) < client_->max_idle;
    if (keep) {
      client_->idle.push_back(std::move(connection_));
    } else {
      beast::error_code ignored;
      connection_->socket.close(ignored);
    }
    Done(absl::OkStatus());
  }

  void Fail(beast::error_code ec, const char* what) {
    if (done_) return;
    beast::error_code ignored;
    if (connection_ != nullptr) connection_->socket.close(ignored);
    if (timed_out_) {
      return Done(absl::DeadlineExceededError(
          absl::StrCat("no complete answer within ", absl::FormatDuration(timeout_))));
    }
    // A kept-alive connection the server closed while it idled: once more, on a new one.
    if (reused_ && !header_seen_ && !retried_ &&
        (ec == http::error::end_of_stream || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::broken_pipe)) {
      retried_ = true;
      ++client_->retries;
      Acquire(/*fresh=*/true);
      return;
    }
    Done(absl::UnavailableError(absl::StrCat(what, ": ", ec.message())));
  }

  void Expire() {
    if (done_) return;
    timed_out_ = true;
    beast::error_code ignored;
    if (connection_ != nullptr) connection_->socket.close(ignored);  // pending ops end aborted
  }

  void Done(absl::Status status) {
    done_ = true;
    timer_.cancel();
    auto on_done = std::move(callbacks_.on_done);
    callbacks_ = {};
    if (on_done) on_done(std::move(status));
  }

  std::shared_ptr<HttpStreamClient::Impl> client_;
  http::request<http::string_body> request_;
  const absl::Duration timeout_;
  HttpStreamClient::Callbacks callbacks_;
  asio::steady_timer timer_;
  std::unique_ptr<Connection> connection_;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  char buffer_[16384];
  bool reused_ = false, retried_ = false, header_seen_ = false, timed_out_ = false, done_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpStreamClient>> HttpStreamClient::Create(asio::io_context* io,
                                                                           const HttpUrl& url,
                                                                           int max_idle) {
  tcp::resolver resolver(*io);
  beast::error_code ec;
  auto endpoints = resolver.resolve(url.host, url.port, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("resolve ", url.host, ":", url.port, ": ", ec.message()));
  }
  return std::unique_ptr<HttpStreamClient>(
      new HttpStreamClient(std::make_shared<Impl>(io, url, std::move(endpoints), max_idle)));
}

HttpStreamClient::HttpStreamClient(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpStreamClient::~HttpStreamClient() {
  beast::error_code ignored;
  for (auto& c : impl_->idle) c->socket.close(ignored);
  impl_->idle.clear();
}

void HttpStreamClient::Post(const std::string& path, std::string body, absl::Duration timeout,
                            Callbacks callbacks) {
  http::request<http::string_body> request(http::verb::post, impl_->url.path + path, 11);
  request.set(http::field::host, impl_->url.host);
  request.set(http::field::user_agent, "ferry-load");
  request.set(http::field::content_type, "application/json");
  request.set(http::field::accept, "text/event-stream");
  request.body() = std::move(body);
  request.prepare_payload();
  std::make_shared<Call>(impl_, std::move(request), timeout, std::move(callbacks))->Start();
}

int64_t HttpStreamClient::connections_opened() const { return impl_->opened; }
int64_t HttpStreamClient::retries() const { return impl_->retries; }

}  // namespace ferry
