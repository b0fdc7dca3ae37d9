// The load tool's HTTP/1.1 client (Boost.Beast on Asio, plain TCP): POSTs whose response body is
// handed over as it arrives (a Server-Sent Events stream), many at once on one io_context, one
// connection per request in flight and kept-alive connections reused. A request that fails on a
// reused connection before any of the response arrived (the server closed it while idle) is
// retried once on a new connection. Every request has a deadline; a request past it is cut off.
// Also a blocking GET for what a run asks before it starts (/v1/models, the admin's /workers).
//
// Beast stays in http_stream_client.cc. Thread-compatible: the client and its callbacks belong
// to the thread that runs the io_context.

#ifndef FERRY_TOOLS_LOAD_HTTP_STREAM_CLIENT_H_
#define FERRY_TOOLS_LOAD_HTTP_STREAM_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace boost::asio {
class io_context;
}  // namespace boost::asio

namespace ferry {

// "http://host:port/prefix" (port default 80; no https).
struct HttpUrl {
  std::string host;
  std::string port = "80";
  std::string path;  // the prefix before the API's paths, "" or "/x" (no trailing '/')
};
absl::StatusOr<HttpUrl> ParseHttpUrl(absl::string_view url);

// GET url: the body of a 200 answer, or an error naming the status (services/common/http_get.h:
// `timeout` bounds the whole exchange).
absl::StatusOr<std::string> HttpGet(const std::string& url, absl::Duration timeout);

class HttpStreamClient {
 public:
  struct Callbacks {
    std::function<void(int status)> on_header;             // the response's status line arrived
    std::function<void(absl::string_view bytes)> on_body;  // body bytes, as they arrive
    std::function<void(absl::Status status)> on_done;      // once, last; OK: the body is whole
  };

  // Resolves the host (blocking). `max_idle`: kept-alive connections kept at most.
  static absl::StatusOr<std::unique_ptr<HttpStreamClient>> Create(boost::asio::io_context* io,
                                                                  const HttpUrl& url,
                                                                  int max_idle = 4096);
  ~HttpStreamClient();
  HttpStreamClient(const HttpStreamClient&) = delete;
  HttpStreamClient& operator=(const HttpStreamClient&) = delete;

  // POSTs `body` (JSON) to url.path + `path`. Call on the io_context's thread.
  void Post(const std::string& path, std::string body, absl::Duration timeout, Callbacks callbacks);

  int64_t connections_opened() const;
  int64_t retries() const;

  class Impl;

 private:
  explicit HttpStreamClient(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_HTTP_STREAM_CLIENT_H_
