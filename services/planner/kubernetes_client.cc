#include "services/planner/kubernetes_client.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"
#include "engine/common/status.h"
#include "services/common/host_port.h"
#include "services/planner/kubernetes_objects.h"

namespace ferry {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using tcp = asio::ip::tcp;

namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;
constexpr size_t kMaxTokenBytes = 64 << 10;
constexpr char kUserAgent[] = "ferry-planner";

// The token, whitespace trimmed. The message names the file, never the content.
absl::StatusOr<std::string> ReadToken(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::FailedPreconditionError(
        ErrnoStatus(errno, absl::StrCat("cannot open the token file ", path)).message());
  }
  std::string content(kMaxTokenBytes + 1, '\0');
  const size_t n = std::fread(content.data(), 1, content.size(), f);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
  if (n > kMaxTokenBytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the token file ", path, " is over ", kMaxTokenBytes, " bytes"));
  }
  content.resize(n);
  std::string token(absl::StripAsciiWhitespace(content));
  if (token.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("the token file ", path, " is empty"));
  }
  for (const char c : token) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) {
      return absl::FailedPreconditionError(
          absl::StrCat("the token file ", path, " holds a character a header cannot carry"));
    }
  }
  return token;
}

// OpenSSL's queued errors as text (empties the queue).
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

// A TLS client context that trusts the certificates of `ca_file` only.
absl::Status MakeTlsContext(const std::string& ca_file, ssl::context* ctx) {
  SSL_CTX* native = ctx->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(native, ca_file.c_str(), nullptr) != 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load the CA file ", ca_file, ": ", OpenSslErrors()));
  }
  ctx->set_verify_mode(ssl::verify_peer);
  return absl::OkStatus();
}

std::chrono::steady_clock::time_point SteadyDeadline(absl::Time deadline) {
  const absl::Duration left =
      std::min(std::max(deadline - absl::Now(), absl::ZeroDuration()), absl::Hours(1));
  return std::chrono::steady_clock::now() +
         std::chrono::nanoseconds(absl::ToInt64Nanoseconds(left));
}

// Runs the io_context until the operation just started has completed (the stream's timer bounds
// every operation, so this returns by the deadline).
void Await(asio::io_context& io) {
  io.run();
  io.restart();
}

// A transport error of `stage` as a Status.
absl::Status TransportError(const beast::error_code& ec, absl::string_view what,
                            absl::string_view stage, size_t max_body) {
  if (ec == beast::error::timeout) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, ": no answer by the deadline (", stage, ")"));
  }
  if (ec == http::error::body_limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the response body is over ", max_body, " bytes"));
  }
  if (ec == http::error::header_limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": the response headers are over ", kMaxHeaderBytes, " bytes"));
  }
  if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return absl::InternalError(
        absl::StrCat(what, ": the answer is not HTTP/1.1 (", ec.message(), ")"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", stage, " failed: ", ec.message()));
}

// Connects `socket` (the lowest layer) to host:port.
absl::Status Connect(asio::io_context& io, beast::tcp_stream& stream, const std::string& host,
                     int port, absl::string_view what) {
  beast::error_code ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (!ec) {
    stream.async_connect(tcp::endpoint(address, static_cast<uint16_t>(port)),
                         [&](beast::error_code e) { ec = e; });
    Await(io);
  } else {
    tcp::resolver resolver(io);
    tcp::resolver::results_type endpoints;
    resolver.async_resolve(host, std::to_string(port),
                           [&](beast::error_code e, tcp::resolver::results_type r) {
                             ec = e;
                             endpoints = std::move(r);
                           });
    Await(io);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat(what, ": cannot resolve ", host, ": ", ec.message()));
    }
    stream.async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    Await(io);
  }
  if (ec) return TransportError(ec, what, absl::StrCat("connect to ", host), 0);
  return absl::OkStatus();
}

// Writes `request` and reads the answer into `parser` over `stream`.
template <class Stream>
absl::Status Exchange(asio::io_context& io, Stream& stream,
                      http::request<http::string_body>& request,
                      http::response_parser<http::string_body>& parser, absl::string_view what,
                      size_t max_body) {
  beast::error_code ec;
  http::async_write(stream, request, [&](beast::error_code e, size_t) { ec = e; });
  Await(io);
  if (ec) return TransportError(ec, what, "sending the request", max_body);
  // The header first, and its Content-Length checked here: Beast 1.74's parser, reading a
  // response's header and body in one go (async_read), skips its own body_limit check when both
  // arrive in one read, and would then reserve whatever Content-Length claims.
  beast::flat_buffer buffer;
  http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
  Await(io);
  if (ec) return TransportError(ec, what, "reading the answer", max_body);
  if (const auto length = parser.content_length(); length && *length > max_body) {
    return TransportError(http::error::body_limit, what, "reading the answer", max_body);
  }
  if (!parser.is_done()) {
    http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
    Await(io);
    if (ec) return TransportError(ec, what, "reading the answer", max_body);
  }
  return absl::OkStatus();
}

}  // namespace

std::string QueryEscape(absl::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (absl::ascii_isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

KubernetesClient::KubernetesClient(KubernetesClientOptions options, bool tls, std::string host,
                                   int port)
    : options_(std::move(options)), tls_(tls), host_(std::move(host)), port_(port) {}

absl::StatusOr<std::unique_ptr<KubernetesClient>> KubernetesClient::Create(
    KubernetesClientOptions options) {
  absl::string_view rest = options.server;
  bool tls;
  if (absl::ConsumePrefix(&rest, "https://")) {
    tls = true;
  } else if (absl::ConsumePrefix(&rest, "http://")) {
    tls = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("the API server's URL '", options.server,
                                                   "' is not https://host[:port] or http://"));
  }
  absl::ConsumeSuffix(&rest, "/");
  if (rest.empty() || rest.find('/') != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the API server's URL '", options.server, "' is not scheme://host[:port]"));
  }
  std::string host;
  int port = tls ? 443 : 80;
  // "host:port", "[v6]:port", or a host alone ("name", "1.2.3.4", "[v6]").
  const bool bracketed = absl::StartsWith(rest, "[");
  if ((bracketed && absl::StrContains(rest, "]:")) ||
      (!bracketed && std::count(rest.begin(), rest.end(), ':') == 1)) {
    RETURN_IF_ERROR(SplitHostPort(rest, &host, &port));
  } else if (bracketed) {
    if (!absl::ConsumeSuffix(&rest, "]")) {
      return absl::InvalidArgumentError(absl::StrCat("bad host in '", options.server, "'"));
    }
    rest.remove_prefix(1);
    host = std::string(rest);
  } else if (absl::StrContains(rest, ":")) {
    return absl::InvalidArgumentError(
        absl::StrCat("an IPv6 host must be bracketed in '", options.server, "'"));
  } else {
    host = std::string(rest);
  }
  if (tls) {
    if (options.ca_file.empty()) {
      return absl::InvalidArgumentError("https needs a CA file (the service account's ca.crt)");
    }
    ssl::context ctx(ssl::context::tls_client);
    RETURN_IF_ERROR(MakeTlsContext(options.ca_file, &ctx));
  }
  if (options.max_response_bytes == 0) {
    return absl::InvalidArgumentError("max_response_bytes must be positive");
  }
  return std::unique_ptr<KubernetesClient>(
      new KubernetesClient(std::move(options), tls, std::move(host), port));
}

absl::StatusOr<std::string> KubernetesClient::Call(const KubernetesRequest& r,
                                                   absl::Time deadline) {
  const std::string target = r.query.empty() ? r.path : absl::StrCat(r.path, "?", r.query);
  const std::string what = absl::StrCat(r.method, " ", target);
  if (absl::Now() >= deadline) {
    return absl::DeadlineExceededError(absl::StrCat(what, ": the deadline passed before the call"));
  }
  const http::verb verb = http::string_to_verb(r.method);
  if (verb == http::verb::unknown) {
    return absl::InvalidArgumentError(absl::StrCat("unknown HTTP method ", r.method));
  }
  http::request<http::string_body> request(verb, target, 11);
  request.set(http::field::host, JoinHostPort(host_, port_));
  request.set(http::field::user_agent, kUserAgent);
  request.set(http::field::accept, "application/json");
  request.set(http::field::connection, "close");
  if (!options_.token_file.empty()) {
    ASSIGN_OR_RETURN(const std::string token, ReadToken(options_.token_file));
    request.set(http::field::authorization, absl::StrCat("Bearer ", token));
  }
  if (!r.content_type.empty()) request.set(http::field::content_type, r.content_type);
  request.body() = r.body;
  request.prepare_payload();

  http::response_parser<http::string_body> parser;
  parser.header_limit(kMaxHeaderBytes);
  parser.body_limit(options_.max_response_bytes);
  asio::io_context io;
  if (tls_) {
    ssl::context ctx(ssl::context::tls_client);
    RETURN_IF_ERROR(MakeTlsContext(options_.ca_file, &ctx));
    beast::ssl_stream<beast::tcp_stream> stream(io, ctx);
    SSL* native = stream.native_handle();
    X509_VERIFY_PARAM* param = SSL_get0_param(native);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    beast::error_code ec;
    asio::ip::make_address(host_, ec);
    const bool is_ip = !ec;
    if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, host_.c_str()) != 1
              : X509_VERIFY_PARAM_set1_host(param, host_.c_str(), host_.size()) != 1 ||
                    SSL_set_tlsext_host_name(native, host_.c_str()) != 1) {
      return absl::InternalError(absl::StrCat("cannot set the TLS peer name: ", OpenSslErrors()));
    }
    beast::get_lowest_layer(stream).expires_at(SteadyDeadline(deadline));
    RETURN_IF_ERROR(Connect(io, beast::get_lowest_layer(stream), host_, port_, what));
    stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
    Await(io);
    if (ec) {
      const long verify = SSL_get_verify_result(native);
      if (verify != X509_V_OK) {
        return absl::UnavailableError(
            absl::StrCat(what, ": the API server's certificate is not trusted: ",
                         X509_verify_cert_error_string(verify), " (CA file ", options_.ca_file,
                         ", host ", host_, ")"));
      }
      return TransportError(ec, what, "TLS handshake", 0);
    }
    RETURN_IF_ERROR(Exchange(io, stream, request, parser, what, options_.max_response_bytes));
  } else {
    beast::tcp_stream stream(io);
    stream.expires_at(SteadyDeadline(deadline));
    RETURN_IF_ERROR(Connect(io, stream, host_, port_, what));
    RETURN_IF_ERROR(Exchange(io, stream, request, parser, what, options_.max_response_bytes));
  }
  http::response<http::string_body> response = parser.release();
  const int code = static_cast<int>(response.result_int());
  if (code >= 200 && code < 300) return std::move(response.body());
  return ApiError(code, response.body(), what);
}

}  // namespace ferry
