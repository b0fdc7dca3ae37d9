#include "router/http/http_server.h"

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <deque>
#include <list>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "boost/asio/bind_executor.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "engine/common/log.h"

namespace ferry {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

const std::string& HttpRequest::header(const std::string& lowercase_name) const {
  static const std::string* const kEmpty = new std::string();
  auto it = headers.find(lowercase_name);
  return it == headers.end() ? *kEmpty : it->second;
}

namespace {

// A lingering close reads (and drops) at most this much at a time.
constexpr size_t kDrainBytes = 64 << 10;

std::string StatusLine(int status, bool http10) {
  const beast::string_view reason = http::obsolete_reason(static_cast<http::status>(status));
  return absl::StrCat(http10 ? "HTTP/1.0 " : "HTTP/1.1 ", status, " ",
                      std::string(reason.data(), reason.size()), "\r\n");
}

// The header block of a response (ends with the blank line).
std::string HeaderBlock(int status, const HttpHeaders& headers, bool http10, bool keep_alive,
                        const std::optional<size_t>& content_length) {
  std::string out = StatusLine(status, http10);
  bool has_type = false;
  for (const auto& [name, value] : headers) {
    const std::string lower = absl::AsciiStrToLower(name);
    if (lower == "content-length" || lower == "transfer-encoding" || lower == "connection") {
      continue;  // the server's to set
    }
    has_type = has_type || lower == "content-type";
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  }
  if (!has_type) out += "Content-Type: text/plain; charset=utf-8\r\n";
  absl::StrAppend(&out, "Server: ferry\r\n");
  if (content_length.has_value()) {
    absl::StrAppend(&out, "Content-Length: ", *content_length, "\r\n");
  } else if (!http10) {
    out += "Transfer-Encoding: chunked\r\n";
  }
  out += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  out += "\r\n";
  return out;
}

}  // namespace

class Session;

class HttpServer::Impl {
 public:
  Impl(const HttpServerOptions& options, HttpHandler handler, HttpErrorBody error_body)
      : options_(options), handler_(std::move(handler)), error_body_(std::move(error_body)) {
    // One io_context per thread, each connection on one of them: a connection's events never
    // wake a second thread to run them (one shared io_context handed work between its threads).
    for (int i = 0; i < std::max(1, options_.threads); ++i) {
      ios_.push_back(std::make_unique<asio::io_context>(1));
    }
    acceptor_.emplace(*ios_[0]);
  }
  ~Impl() { Shutdown(absl::ZeroDuration()); }

  absl::Status Listen();
  void Shutdown(absl::Duration grace);

  const HttpServerOptions& options() const { return options_; }
  const HttpHandler& handler() const { return handler_; }
  // The body of an error the server answers itself (HttpErrorBody).
  std::string ErrorBody(int status, const std::string& path, const std::string& message) const {
    std::string body = error_body_ ? error_body_(status, path, message) : "";
    if (!body.empty()) return body;
    std::string quoted;
    for (char c : message) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    return absl::StrCat("{\"error\":{\"message\":\"", quoted,
                        "\",\"type\":\"invalid_request_error\",\"param\":null,\"code\":null}}");
  }
  bool shutting_down() const { return shutting_down_.load(); }
  int port() const { return port_; }
  int64_t connections() const { return connections_.load(); }
  int64_t active_requests() const { return active_.load(); }

  void RequestStarted() { active_.fetch_add(1); }
  void RequestEnded() {
    if (active_.fetch_sub(1) == 1) {
      absl::MutexLock lock(&mu_);
      idle_.SignalAll();
    }
  }
  void SessionEnded(Session* session);

 private:
  void Accept();

  const HttpServerOptions options_;
  const HttpHandler handler_;
  const HttpErrorBody error_body_;
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::optional<tcp::acceptor> acceptor_;  // on ios_[0]
  size_t next_io_ = 0;                     // the io_context of the next connection
  std::vector<std::thread> threads_;
  int port_ = 0;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> connections_{0};
  std::atomic<int64_t> active_{0};

  absl::Mutex mu_;
  absl::CondVar idle_;
  std::list<std::weak_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);  // under mu_
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;                        // under mu_
};

// One connection. Reading requests, timers and closing run on its strand. Answers are written
// from whichever thread gives them (the handler's, or the thread a worker's tokens arrive on):
// under write_mu_, the bytes go to the socket at once with a non-blocking send() when no write is
// pending, so that a streamed token costs no hand-off to an I/O thread; what the socket does not
// take at once is written by the strand (an asynchronous write, bounded by write_timeout), and
// later answers queue behind it in order. The strand learns that a request is answered (to read
// the next one) through one post per request.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : stream_(std::move(socket)), server_(server) {
    beast::error_code ec;
    const tcp::endpoint remote = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = absl::StrCat(remote.address().to_string(), ":", remote.port());
    fd_ = stream_.socket().native_handle();
  }

  std::list<std::weak_ptr<Session>>::iterator registration;

  void Start() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->WaitForRequest(); });
  }

  // Refuses the connection: too many are open.
  void RefuseAndClose() {
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      const std::string body = "too many connections";
      absl::MutexLock lock(&self->write_mu_);
      self->keep_alive_ = false;
      self->closing_after_write_ = true;
      self->AppendLocked(HeaderBlock(503, {{"Retry-After", "1"}}, false, false, body.size()) +
                         body);
    });
  }

  // Shutdown: close now when no request is being answered, or at the end of the current one.
  void CloseWhenIdle() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] {
      {
        absl::MutexLock lock(&self->write_mu_);
        self->keep_alive_ = false;
      }
      if (!self->in_request_) self->Close();
    });
  }
  // Closes on the strand, from any thread (also under write_mu_: it only posts).
  void CloseNow() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->Close(); });
  }

  // --- For the responder: from any thread.
  void Respond(int status, const HttpHeaders& headers, std::string body) {
    absl::MutexLock lock(&write_mu_);
    if (closed_ || answered_) return;
    answered_ = true;
    AppendLocked(HeaderBlock(status, headers, version_ == 10, keep_alive_, body.size()) + body);
    complete_ = true;
    MaybeEndRequestLocked();
  }
  void StartStream(int status, const HttpHeaders& headers) {
    absl::MutexLock lock(&write_mu_);
    if (closed_ || answered_) return;
    answered_ = true;
    streaming_ = true;
    if (version_ == 10) keep_alive_ = false;  // no chunking: the end of the stream is the close
    AppendLocked(HeaderBlock(status, headers, version_ == 10, keep_alive_, std::nullopt));
  }
  // False once the stream is gone (closed, or cut off now).
  bool WriteChunk(const std::string& data) {
    absl::MutexLock lock(&write_mu_);
    if (closed_ || cut_off_) return false;
    if (!streaming_ || complete_ || data.empty()) return true;
    if (version_ == 10) {
      AppendLocked(data);
    } else {
      AppendLocked(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
    }
    if (out_.size() - sent_ + inflight_.size() > server_->options().max_stream_buffer_bytes) {
      LOG(WARNING) << "http: " << remote_ << " does not read its stream; cut off";
      cut_off_ = true;
      CloseNow();
      return false;
    }
    return true;
  }
  void FinishStream() {
    absl::MutexLock lock(&write_mu_);
    if (closed_ || !streaming_ || complete_) return;
    if (version_ != 10) AppendLocked("0\r\n\r\n");
    complete_ = true;
    MaybeEndRequestLocked();
  }
  bool stream_broken() {
    absl::MutexLock lock(&write_mu_);
    return closed_ || cut_off_;
  }
  // On the strand (the handler runs there).
  void SetOnClose(std::function<void()> callback) {
    bool run_now;
    {
      absl::MutexLock lock(&write_mu_);
      run_now = closed_ && !complete_;
    }
    if (run_now) {
      callback();
      return;
    }
    on_close_ = std::move(callback);
  }
  beast::tcp_stream::executor_type executor() { return stream_.get_executor(); }

 private:
  void WaitForRequest() {
    bool closed, keep_alive;
    {
      absl::MutexLock lock(&write_mu_);
      closed = closed_;
      keep_alive = keep_alive_;
    }
    if (closed) return;
    if (server_->shutting_down() || !keep_alive) return Close();
    // Idle until the first byte (or use what a pipelining client already sent).
    if (buffer_.size() > 0) return ReadRequest();
    stream_.expires_after(absl::ToChronoMilliseconds(server_->options().idle_timeout));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->Close();
                              self->buffer_.commit(n);
                              self->ReadRequest();
                            });
  }

  void ReadRequest() {
    parser_.emplace();
    parser_->header_limit(server_->options().max_header_bytes);
    parser_->body_limit(server_->options().max_body_bytes);
    stream_.expires_after(absl::ToChronoMilliseconds(server_->options().read_timeout));
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == asio::error::operation_aborted ||
        ec == beast::error::timeout || ec == asio::error::connection_reset) {
      return Close();
    }
    stream_.expires_never();  // the answer's writes set their own deadline
    if (ec) {
      int status = 400;
      if (ec == http::error::header_limit) status = 431;
      if (ec == http::error::body_limit) status = 413;
      // The request's path, once its request line was read (a Content-Length over the limit is
      // refused before the header is done).
      const beast::string_view target = parser_->get().target();
      const std::string path(target.substr(0, target.find('?')));
      const std::string message = ec == http::error::body_limit
                                      ? absl::StrCat("request body too large (at most ",
                                                     server_->options().max_body_bytes, " bytes)")
                                  : ec == http::error::header_limit ? "request header too large"
                                                                    : "malformed HTTP request";
      const std::string body = server_->ErrorBody(status, path, message);
      absl::MutexLock lock(&write_mu_);
      if (closed_) return;
      keep_alive_ = false;
      closing_after_write_ = true;
      AppendLocked(
          HeaderBlock(status, {{"Content-Type", "application/json"}}, false, false, body.size()) +
          body);
      return;
    }
    http::request<http::string_body> message = parser_->release();
    HttpRequest request;
    request.method = std::string(message.method_string());
    request.target = std::string(message.target());
    request.path = request.target.substr(0, request.target.find('?'));
    for (const auto& field : message) {
      request.headers[absl::AsciiStrToLower(std::string(field.name_string()))] =
          std::string(field.value());
    }
    request.body = std::move(message.body());
    request.remote = remote_;
    {
      absl::MutexLock lock(&write_mu_);
      if (closed_) return;
      version_ = message.version();
      keep_alive_ = message.keep_alive();
      answered_ = complete_ = streaming_ = false;
    }
    in_request_ = true;
    server_->RequestStarted();
    counted_ = true;
    if (server_->shutting_down()) {
      {
        absl::MutexLock lock(&write_mu_);
        keep_alive_ = false;
      }
      Respond(503, {{"Content-Type", "application/json"}, {"Retry-After", "1"}},
              "{\"error\":{\"message\":\"the server is shutting down\",\"type\":"
              "\"server_error\",\"param\":null,\"code\":null}}");
      return;
    }
    server_->handler()(std::move(request), MakeResponder());
    WatchForClose();
  }

  // While a request is being answered, a client that closes its connection must be noticed at
  // once (its request is then aborted), not at the next write: wait for the socket to become
  // readable and peek. End of stream or an error closes the session; bytes (a pipelined request)
  // stay in the socket for the next read, and watching stops.
  void WatchForClose() {
    if (!in_request_ || stream_broken()) return;
    const uint64_t request = ++request_number_;
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        asio::bind_executor(
            stream_.get_executor(), [self = shared_from_this(), request](beast::error_code ec) {
              if (!self->in_request_ || request != self->request_number_ || self->stream_broken()) {
                return;
              }
              if (ec) return self->Close();
              char byte;
              const ssize_t n = ::recv(self->fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
              if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                self->Close();
              } else if (n < 0) {
                self->WatchForClose();  // spurious
              }
            }));
  }

  std::shared_ptr<HttpResponder> MakeResponder();

  // Queues `bytes` behind what is pending and sends what the socket takes now, unless a strand
  // write is in flight (it will). Under write_mu_.
  void AppendLocked(const std::string& bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    out_ += bytes;
    if (!writing_) SendLocked();
  }

  // A non-blocking send of out_. Whatever is left goes to the strand's asynchronous write; a
  // failed send closes the connection (on the strand). Under write_mu_, with no write in flight.
  void SendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    while (sent_ < out_.size()) {
      const ssize_t n =
          ::send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent_ += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        writing_ = true;
        asio::post(stream_.get_executor(), [self = shared_from_this()] { self->FlushOnStrand(); });
        return;
      }
      cut_off_ = true;  // the peer is gone
      CloseNow();
      return;
    }
    out_.clear();
    sent_ = 0;
    AfterFlushLocked();
  }

  // Everything written: linger and close if that was the last word (an error answer), or let the
  // strand read the next request.
  void AfterFlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    if (closing_after_write_) {
      asio::post(stream_.get_executor(), [self = shared_from_this()] { self->Linger(); });
    } else if (complete_ && !end_posted_) {
      end_posted_ = true;
      asio::post(stream_.get_executor(), [self = shared_from_this()] { self->EndRequest(); });
    }
  }

  void MaybeEndRequestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_) {
    if (!writing_ && out_.empty()) AfterFlushLocked();
  }

  // On the strand: writes what the socket did not take at once (the asynchronous write must make
  // progress within write_timeout, or the connection closes), then sends what queued meanwhile.
  void FlushOnStrand() {
    {
      absl::MutexLock lock(&write_mu_);
      if (closed_) return;
      inflight_.assign(out_, sent_, std::string::npos);
      out_.clear();
      sent_ = 0;
    }
    stream_.expires_after(absl::ToChronoMilliseconds(server_->options().write_timeout));
    asio::async_write(stream_, asio::buffer(inflight_),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->Close();
                        absl::MutexLock lock(&self->write_mu_);
                        if (self->closed_) return;
                        self->inflight_.clear();
                        self->writing_ = false;
                        self->SendLocked();  // what queued meanwhile (or nothing: done)
                      });
  }

  // The answer is complete and written: next request, or close. On the strand.
  void EndRequest() {
    {
      absl::MutexLock lock(&write_mu_);
      end_posted_ = false;
      if (closed_ || !complete_ || writing_ || !out_.empty()) return;
    }
    if (!in_request_) return;
    in_request_ = false;
    on_close_ = nullptr;
    if (counted_) {
      counted_ = false;
      server_->RequestEnded();
    }
    WaitForRequest();
  }

  // A lingering close, after an error answer that leaves the request unread (413 while the client
  // still sends its body, 400, 431, 503 to a connection over max_connections), as nginx's: the
  // request is no longer parsed, the answer is all sent, the sending side is shut (the client
  // reads the answer, then the end), and what the client still sends is read and dropped until it
  // closes, linger_timeout passes or linger_max_bytes arrived; then the connection closes. Closing
  // at once with unread bytes would send a reset, which makes the client's kernel drop the answer
  // it has not read yet. On the strand.
  void Linger() {
    {
      absl::MutexLock lock(&write_mu_);
      if (closed_) return;
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
    parser_.reset();
    buffer_.clear();  // what was read of the request
    linger_left_ = server_->options().linger_max_bytes;
    linger_until_ = std::chrono::steady_clock::now() +
                    absl::ToChronoMilliseconds(server_->options().linger_timeout);
    Drain();
  }

  // One read of the lingering close, bounded by what is left of its time (the stream's timer
  // closes the socket when it fires) and of its bytes.
  void Drain() {
    const auto left = linger_until_ - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero() || linger_left_ == 0) return Close();
    stream_.expires_after(left);
    stream_.async_read_some(buffer_.prepare(kDrainBytes),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              // The client's end, the deadline, a reset, or Close() itself.
                              if (ec) return self->Close();
                              self->linger_left_ -= std::min<uint64_t>(n, self->linger_left_);
                              self->Drain();
                            });
  }

  // On the strand.
  void Close() {
    bool answered_whole;
    {
      absl::MutexLock lock(&write_mu_);
      if (closed_) return;
      closed_ = true;
      answered_whole = complete_;
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
      stream_.socket().close(ignored);
    }
    if (in_request_ && !answered_whole && on_close_) {
      auto callback = std::move(on_close_);
      on_close_ = nullptr;
      callback();
    }
    if (counted_) {
      counted_ = false;
      server_->RequestEnded();
    }
    in_request_ = false;
    server_->SessionEnded(this);
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* const server_;
  std::string remote_;
  int fd_ = -1;
  // On the strand.
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t linger_left_ = 0;                            // bytes a lingering close still reads
  std::chrono::steady_clock::time_point linger_until_;  // and until when
  bool in_request_ = false;
  bool counted_ = false;
  uint64_t request_number_ = 0;
  std::function<void()> on_close_;
  // The answer being given, under write_mu_ (the socket is closed under it too: no send ever
  // reaches a closed descriptor, or one reused by another connection).
  absl::Mutex write_mu_;
  unsigned version_ ABSL_GUARDED_BY(write_mu_) = 11;
  bool keep_alive_ ABSL_GUARDED_BY(write_mu_) = true;
  bool answered_ ABSL_GUARDED_BY(write_mu_) = false, complete_ = false, streaming_ = false;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false, cut_off_ = false, closing_after_write_ = false;
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;     // the strand writes what is pending
  bool end_posted_ ABSL_GUARDED_BY(write_mu_) = false;  // EndRequest is on its way to the strand
  std::string out_ ABSL_GUARDED_BY(write_mu_);  // pending bytes; out_[0, sent_) already sent
  size_t sent_ ABSL_GUARDED_BY(write_mu_) = 0;
  // What the strand's write is writing (while writing_): the strand's alone meanwhile, so not
  // guarded by write_mu_.
  std::string inflight_;
};

// Calls the session directly (it is thread-safe); OnClose on the strand.
class SessionResponder final : public HttpResponder,
                               public std::enable_shared_from_this<SessionResponder> {
 public:
  explicit SessionResponder(std::shared_ptr<Session> session) : session_(std::move(session)) {}

  void Respond(int status, const HttpHeaders& headers, std::string body) override {
    session_->Respond(status, headers, std::move(body));
  }
  void StartStream(int status, const HttpHeaders& headers) override {
    session_->StartStream(status, headers);
  }
  bool Write(std::string data) override {
    if (closed_.load()) return false;
    if (!session_->WriteChunk(data)) {
      closed_.store(true);
      return false;
    }
    return true;
  }
  void Finish() override { session_->FinishStream(); }
  void OnClose(std::function<void()> callback) override {
    std::weak_ptr<SessionResponder> weak = shared_from_this();
    std::shared_ptr<Session> s = session_;
    asio::dispatch(s->executor(), [s, callback = std::move(callback), weak]() mutable {
      s->SetOnClose([callback = std::move(callback), weak] {
        if (auto self = weak.lock()) self->MarkClosed();
        callback();
      });
    });
  }
  bool closed() const override { return closed_.load() || session_->stream_broken(); }

  void MarkClosed() { closed_.store(true); }

 private:
  const std::shared_ptr<Session> session_;
  std::atomic<bool> closed_{false};
};

std::shared_ptr<HttpResponder> Session::MakeResponder() {
  auto responder = std::make_shared<SessionResponder>(shared_from_this());
  // The responder learns of a close even when the handler never asks (Write returns false).
  std::weak_ptr<SessionResponder> weak = responder;
  on_close_ = [weak] {
    if (auto r = weak.lock()) r->MarkClosed();
  };
  return responder;
}

absl::Status HttpServer::Impl::Listen() {
  beast::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(options_.host, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("'", options_.host, "' is not an IP"));
  if (options_.port < 0 || options_.port > 65535 || options_.threads < 1 ||
      options_.max_connections < 1) {
    return absl::InvalidArgumentError("http server: bad port, threads or max_connections");
  }
  const tcp::endpoint endpoint(ip, static_cast<unsigned short>(options_.port));
  acceptor_->open(endpoint.protocol(), ec);
  if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(endpoint, ec);
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.host, ":", options_.port, ": ", ec.message()));
  }
  port_ = acceptor_->local_endpoint().port();
  for (auto& io : ios_) work_.emplace_back(io->get_executor());
  Accept();
  for (auto& io : ios_) threads_.emplace_back([io = io.get()] { io->run(); });
  return absl::OkStatus();
}

void HttpServer::Impl::Accept() {
  asio::io_context& io = *ios_[next_io_++ % ios_.size()];
  acceptor_->async_accept(asio::make_strand(io), [this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || shutting_down_) return;
    if (!ec) {
      // A stream's header and its events are small writes that must leave at once: with Nagle's
      // algorithm each waited for the client's delayed ACK (40 ms on Linux) before going out.
      beast::error_code no_delay;
      socket.set_option(tcp::no_delay(true), no_delay);
      if (options_.socket_send_buffer_bytes > 0) {
        beast::error_code ignored;
        socket.set_option(asio::socket_base::send_buffer_size(options_.socket_send_buffer_bytes),
                          ignored);
      }
      auto session = std::make_shared<Session>(std::move(socket), this);
      const bool full = connections_.load() >= options_.max_connections;
      {
        absl::MutexLock lock(&mu_);
        session->registration = sessions_.insert(sessions_.end(), session);
      }
      connections_.fetch_add(1);
      if (full) {
        session->RefuseAndClose();
      } else {
        session->Start();
      }
    }
    Accept();
  });
}

void HttpServer::Impl::SessionEnded(Session* session) {
  connections_.fetch_sub(1);
  absl::MutexLock lock(&mu_);
  sessions_.erase(session->registration);
  idle_.SignalAll();
}

void HttpServer::Impl::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (work_.empty()) return;  // never listened
  shutting_down_ = true;
  asio::post(*ios_[0], [this] {
    beast::error_code ignored;
    acceptor_->close(ignored);
  });
  std::vector<std::shared_ptr<Session>> sessions;
  auto collect = [&] {
    absl::MutexLock lock(&mu_);
    sessions.clear();
    for (auto& weak : sessions_) {
      if (auto s = weak.lock()) sessions.push_back(s);
    }
  };
  collect();
  for (auto& s : sessions) s->CloseWhenIdle();
  {
    absl::MutexLock lock(&mu_);
    const absl::Time give_up = absl::Now() + std::max(grace, absl::ZeroDuration());
    while (active_.load() != 0 && !idle_.WaitWithDeadline(&mu_, give_up)) {
    }
  }
  collect();
  for (auto& s : sessions) s->CloseNow();
  sessions.clear();
  {
    absl::MutexLock lock(&mu_);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (!sessions_.empty() && !idle_.WaitWithDeadline(&mu_, give_up)) {
    }
  }
  work_.clear();
  for (auto& io : ios_) io->stop();
  for (auto& t : threads_) t.join();
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                              HttpHandler handler,
                                                              HttpErrorBody error_body) {
  auto impl = std::make_unique<Impl>(options, std::move(handler), std::move(error_body));
  if (absl::Status s = impl->Listen(); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Shutdown(absl::ZeroDuration()); }
int HttpServer::port() const { return impl_->port(); }
int64_t HttpServer::connections() const { return impl_->connections(); }
int64_t HttpServer::active_requests() const { return impl_->active_requests(); }
void HttpServer::Shutdown(absl::Duration grace) { impl_->Shutdown(grace); }

}  // namespace ferry
