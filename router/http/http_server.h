// The router's HTTP/1.1 server (ARCHITECTURE.md §1: Boost.Beast on Asio): keep-alive, whole
// responses and streamed ones (chunked transfer, what Server-Sent Events ride on), and the bounds
// a public front door needs, every one of them an option:
//
//   - at most max_connections open connections (more are answered 503 and closed);
//   - a request's header at most max_header_bytes (431), its body at most max_body_bytes (413);
//   - a request must arrive whole within read_timeout of its first byte (slow clients are cut off),
//     a keep-alive connection may idle idle_timeout between requests, and a response write that
//     makes no progress for write_timeout (a client that does not read) closes the connection;
//   - a streamed response buffers at most max_stream_buffer_bytes not yet written (and the kernel
//     at most socket_send_buffer_bytes); a stream that would exceed it is cut off (the handler
//     learns it: Write returns false, OnClose runs).
//   - an error answered before the request was read whole (413, 431, 400 for a malformed request,
//     503 over max_connections) closes the connection lingering, as nginx does: the answer, a
//     half-close, then what the client still sends is read and dropped for at most
//     linger_timeout and linger_max_bytes, so that a client still sending its body reads the
//     answer instead of a connection reset.
//
// A handler gets each request with an HttpResponder, answers through it from any thread (now or
// later), and learns through OnClose when the client went away first. Handlers run on the I/O
// threads and must not block.
//
// Shutdown(grace): the listener closes, idle connections close, requests that arrive on open
// connections get 503, requests in progress get `grace` to finish, then every connection closes.
//
// Thread-safe.

#ifndef FERRY_ROUTER_HTTP_HTTP_SERVER_H_
#define FERRY_ROUTER_HTTP_HTTP_SERVER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ferry {

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // a numeric address
  int port = 0;                    // 0: any free port
  int threads = 2;
  int max_connections = 1024;
  uint32_t max_header_bytes = 16 << 10;
  uint64_t max_body_bytes = 8 << 20;
  absl::Duration read_timeout = absl::Seconds(30);
  absl::Duration idle_timeout = absl::Seconds(60);
  absl::Duration write_timeout = absl::Seconds(30);
  size_t max_stream_buffer_bytes = 4 << 20;
  // The kernel's send buffer per connection (SO_SNDBUF; 0: the kernel's autotuning, which lets a
  // client that does not read pin megabytes per connection).
  int socket_send_buffer_bytes = 256 << 10;
  // The lingering close after an error answer: how long, and how many bytes, it reads at most.
  absl::Duration linger_timeout = absl::Seconds(1);
  uint64_t linger_max_bytes = uint64_t{128} << 20;  // 16x the default max_body_bytes
};

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // as sent: path and query
  std::string path;                            // target without the query
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
  std::string remote;  // peer "ip:port"

  // The header's value, or "" when absent.
  const std::string& header(const std::string& lowercase_name) const;
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// How a handler answers one request. Thread-safe; every method may be called from any thread.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A whole response (Content-Length set). Ignored after the first answer or once closed.
  virtual void Respond(int status, const HttpHeaders& headers, std::string body) = 0;
  // A streamed response: the status and headers now, then Write()s, then Finish().
  virtual void StartStream(int status, const HttpHeaders& headers) = 0;
  // Queues `data` as one chunk. False when the stream is gone: the client closed it, or it fell
  // more than max_stream_buffer_bytes behind (then it is cut off).
  virtual bool Write(std::string data) = 0;
  virtual void Finish() = 0;
  // Runs once, on an I/O thread, when the connection closes before the answer was complete
  // (client gone, timeout, cut off, shutdown). Set it before answering; at most one.
  virtual void OnClose(std::function<void()> callback) = 0;
  virtual bool closed() const = 0;
};

using HttpHandler = std::function<void(HttpRequest request, std::shared_ptr<HttpResponder>)>;

// The JSON body of an error the server answers by itself, before any handler (400 for a malformed
// request, 413, 431), to a request for `path` ("" when its request line was not read), saying
// `message`: the API's error shape. "" (or no function): OpenAI's, {"error": {"message", "type":
// "invalid_request_error", "param": null, "code": null}}.
using HttpErrorBody =
    std::function<std::string(int status, const std::string& path, const std::string& message)>;

class HttpServer {
 public:
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler,
                                                           HttpErrorBody error_body = nullptr);
  ~HttpServer();  // Shutdown(0)

  int port() const;
  // Connections open now, requests being answered now.
  int64_t connections() const;
  int64_t active_requests() const;

  void Shutdown(absl::Duration grace);

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_HTTP_HTTP_SERVER_H_
