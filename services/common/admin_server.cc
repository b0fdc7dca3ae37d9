#include "services/common/admin_server.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/strand.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "engine/common/log.h"
#include "prometheus/text_serializer.h"

namespace ferry {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

constexpr uint32_t kMaxHeaderBytes = 8 * 1024;
constexpr uint64_t kMaxBodyBytes = 1024;

}  // namespace

class AdminServer::Impl {
 public:
  Impl(const AdminServerOptions& options, std::shared_ptr<prometheus::Registry> registry)
      : options_(options), registry_(std::move(registry)), acceptor_(io_) {}

  ~Impl() { Stop(); }

  absl::Status Listen() {
    beast::error_code ec;
    const asio::ip::address ip = asio::ip::make_address(options_.host, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("admin server: '", options_.host, "' is not a numeric IP address"));
    }
    if (options_.port < 0 || options_.port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("admin server: bad port ", options_.port));
    }
    const tcp::endpoint endpoint(ip, static_cast<unsigned short>(options_.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("admin server: cannot listen on ", options_.host,
                                                 ":", options_.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    LOG(INFO) << "admin HTTP server (/metrics /healthz /readyz) on " << options_.host << ":"
              << port_;
    return absl::OkStatus();
  }

  // Closes the listener and every open connection on the I/O thread; their pending operations
  // then finish with operation_aborted, io_.run() runs out of work, and the thread exits.
  void Stop();

  int port() const { return port_; }

  void SetReady(bool ready, const std::string& reason) {
    absl::MutexLock lock(&mu_);
    ready_ = ready;
    not_ready_reason_ = reason;
  }

  // Builds the response to one request. Runs on the I/O thread.
  http::response<http::string_body> Handle(const http::request<http::string_body>& request) {
    http::response<http::string_body> response;
    response.version(request.version());
    response.keep_alive(request.keep_alive());
    response.set(http::field::server, "ferry-admin");
    response.set(http::field::content_type, "text/plain; charset=utf-8");
    const beast::string_view target = request.target();
    const beast::string_view path = target.substr(0, target.find('?'));
    AdminReply reply;
    if (options_.routes && options_.routes(std::string(request.method_string()), std::string(path),
                                           request.body(), &reply)) {
      response.result(static_cast<http::status>(reply.status));
      response.set(http::field::content_type, reply.content_type);
      response.body() = std::move(reply.body);
    } else if (request.method() != http::verb::get) {
      response.result(http::status::method_not_allowed);
      response.set(http::field::allow, "GET");
      response.body() = "method not allowed\n";
    } else if (path == "/healthz") {
      response.result(http::status::ok);
      response.body() = "ok\n";
    } else if (path == "/readyz") {
      absl::MutexLock lock(&mu_);
      response.result(ready_ ? http::status::ok : http::status::service_unavailable);
      response.body() = ready_ ? "ready\n" : absl::StrCat("not ready: ", not_ready_reason_, "\n");
    } else if (path == "/metrics" && registry_ != nullptr) {
      response.result(http::status::ok);
      response.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      response.body() = prometheus::TextSerializer().Serialize(registry_->Collect());
    } else {
      response.result(http::status::not_found);
      response.body() = "not found; try /metrics, /healthz or /readyz\n";
    }
    response.prepare_payload();
    return response;
  }

  absl::Duration idle_timeout() const { return options_.idle_timeout; }

 private:
  class Session;
  void Accept();

  const AdminServerOptions options_;
  const std::shared_ptr<prometheus::Registry> registry_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  std::thread thread_;
  int port_ = 0;
  // Open connections; touched only on the I/O thread.
  std::vector<std::weak_ptr<Session>> sessions_;

  absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string not_ready_reason_ ABSL_GUARDED_BY(mu_) = "starting";
};

// One client connection: read a request, answer it, repeat while keep-alive.
class AdminServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, Impl* server) : stream_(std::move(socket)), server_(server) {}

  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxBodyBytes);
    stream_.expires_after(absl::ToChronoMilliseconds(server_->idle_timeout()));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == asio::error::operation_aborted || ec == asio::error::connection_reset) {
      Close();
      return;
    }
    if (ec) {
      // Malformed or oversized request: answer 400 and close.
      response_ = {};
      response_.result(http::status::bad_request);
      response_.set(http::field::content_type, "text/plain; charset=utf-8");
      response_.body() = absl::StrCat("bad request: ", ec.message(), "\n");
      response_.keep_alive(false);
      response_.prepare_payload();
    } else {
      response_ = server_->Handle(parser_->get());
    }
    http::async_write(stream_, response_,
                      [self = shared_from_this()](beast::error_code write_ec, size_t) {
                        if (write_ec || !self->response_.keep_alive()) {
                          self->Close();
                        } else {
                          self->Read();
                        }
                      });
  }

  beast::tcp_stream stream_;
  Impl* const server_;
  beast::flat_buffer buffer_{kMaxHeaderBytes + kMaxBodyBytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
};

void AdminServer::Impl::Stop() {
  if (!thread_.joinable()) return;
  asio::post(io_, [this] {
    beast::error_code ignored;
    acceptor_.close(ignored);
    for (const std::weak_ptr<Session>& weak : sessions_) {
      if (std::shared_ptr<Session> session = weak.lock()) session->Close();
    }
    sessions_.clear();
  });
  thread_.join();
}

void AdminServer::Impl::Accept() {
  acceptor_.async_accept(asio::make_strand(io_), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;  // closed by Stop()
    if (ec) {
      LOG(WARNING) << "admin server: accept failed: " << ec.message();
    } else {
      auto session = std::make_shared<Session>(std::move(socket), this);
      sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(),
                                     [](const std::weak_ptr<Session>& w) { return w.expired(); }),
                      sessions_.end());
      sessions_.push_back(session);
      session->Read();
    }
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<AdminServer>> AdminServer::Start(
    const AdminServerOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  auto impl = std::make_unique<Impl>(options, std::move(registry));
  const absl::Status status = impl->Listen();
  if (!status.ok()) return status;
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

AdminServer::AdminServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AdminServer::~AdminServer() = default;

int AdminServer::port() const { return impl_->port(); }

void AdminServer::SetReady(bool ready, const std::string& reason) {
  impl_->SetReady(ready, reason);
}

void AdminServer::Stop() { impl_->Stop(); }

}  // namespace ferry
