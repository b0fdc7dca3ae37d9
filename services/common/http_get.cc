#include "services/common/http_get.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/address.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "services/common/host_port.h"

namespace ferry {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

absl::StatusOr<std::string> HttpGet(absl::string_view address, absl::string_view target,
                                    absl::Time deadline, const HttpGetOptions& options) {
  std::string host;
  int port = 0;
  if (absl::Status s = SplitHostPort(address, &host, &port); !s.ok()) return s;
  if (target.empty() || target[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("GET '", target, "': not a path"));
  }
  const std::string what = absl::StrCat("GET http://", address, target);
  auto timed_out = [&] { return absl::DeadlineExceededError(absl::StrCat(what, ": timed out")); };
  if (absl::Now() >= deadline) return timed_out();

  asio::io_context io;
  std::vector<tcp::endpoint> endpoints;
  beast::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(host, ec);
  if (!ec) {
    endpoints.emplace_back(ip, static_cast<uint16_t>(port));
  } else {
    tcp::resolver resolver(io);
    const auto found = resolver.resolve(host, std::to_string(port), ec);
    if (ec) return absl::UnavailableError(absl::StrCat(what, ": ", ec.message()));
    for (const auto& entry : found) endpoints.push_back(entry.endpoint());
    if (absl::Now() >= deadline) return timed_out();
  }

  // The whole exchange on one io_context, every step under the stream's expiry (Beast's timeouts
  // hold for asynchronous operations only).
  beast::tcp_stream stream(io);
  stream.expires_after(std::chrono::nanoseconds(absl::ToInt64Nanoseconds(deadline - absl::Now())));
  http::request<http::empty_body> request(http::verb::get, std::string(target), 11);
  request.set(http::field::host, std::string(address));
  request.set(http::field::user_agent, options.user_agent);
  request.set(http::field::connection, "close");
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(static_cast<uint64_t>(options.max_body_bytes));
  beast::error_code failed;
  stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) {
    if (e) {
      failed = e;
      return;
    }
    http::async_write(stream, request, [&](beast::error_code e, size_t) {
      if (e) {
        failed = e;
        return;
      }
      // The header first: Beast 1.74 does not hold a Content-Length to the parser's body limit
      // (a chunked or unframed body it does).
      http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) {
        if (!e && parser.content_length() &&
            *parser.content_length() > static_cast<uint64_t>(options.max_body_bytes)) {
          e = http::error::body_limit;
        }
        if (e) {
          failed = e;
          return;
        }
        http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) { failed = e; });
      });
    });
  });
  io.run();
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  if (failed == beast::error::timeout) return timed_out();
  if (failed == http::error::body_limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the body is over ", options.max_body_bytes, " bytes"));
  }
  if (failed) return absl::UnavailableError(absl::StrCat(what, ": ", failed.message()));
  http::response<http::string_body> response = parser.release();
  const int code = response.result_int();
  if (code != 200) {
    const std::string message =
        absl::StrCat(what, ": HTTP ", code, ": ", response.body().substr(0, 300));
    return code == 404 ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  return std::move(response.body());
}

}  // namespace ferry
