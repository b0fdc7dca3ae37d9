#include "router/fetch/remote_image_fetcher.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
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
#include "router/fetch/image_url.h"
#include "router/fetch/ip_address.h"
#include "services/common/dns_resolver.h"

namespace ferry {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;

struct RemoteImageFetcher::Tls {
  ssl::context ctx{ssl::context::tls_client};
};

namespace {

constexpr char kUserAgent[] = "ferry-router (remote image fetch)";

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

std::chrono::steady_clock::time_point SteadyDeadline(absl::Time deadline) {
  const absl::Duration left =
      std::min(std::max(deadline - absl::Now(), absl::ZeroDuration()), absl::Hours(1));
  return std::chrono::steady_clock::now() +
         std::chrono::nanoseconds(absl::ToInt64Nanoseconds(left));
}

// Runs the I/O context until the operation just started completes (the stream's timer bounds
// every operation, so this returns by the deadline).
void Await(asio::io_context& io) {
  io.run();
  io.restart();
}

asio::ip::address ToAsio(const IpAddress& ip) {
  if (ip.v6) {
    asio::ip::address_v6::bytes_type b;
    std::copy(ip.bytes.begin(), ip.bytes.end(), b.begin());
    return asio::ip::address_v6(b);
  }
  asio::ip::address_v4::bytes_type b;
  std::copy(ip.bytes.begin(), ip.bytes.begin() + 4, b.begin());
  return asio::ip::address_v4(b);
}

// One fetch: the URL, its deadline and how to word a timeout.
class Call {
 public:
  Call(const RemoteImageFetcherOptions& options, ImageUrl url, absl::Time deadline,
       bool caller_deadline)
      : options_(options),
        url_(std::move(url)),
        deadline_(deadline),
        caller_deadline_(caller_deadline),
        what_(absl::StrCat("image URL host '", url_.host, "'")) {}

  const ImageUrl& url() const { return url_; }
  const std::string& what() const { return what_; }
  absl::Time deadline() const { return deadline_; }

  absl::Status Timeout(absl::string_view stage) const {
    if (caller_deadline_) {
      return absl::DeadlineExceededError(
          absl::StrCat("the request's deadline passed while fetching the image (", stage, ")"));
    }
    return absl::InvalidArgumentError(absl::StrCat(what_, " did not answer within ",
                                                   absl::FormatDuration(options_.timeout), " (",
                                                   stage, ")"));
  }

  // A transport error of `stage` as a Status.
  absl::Status TransportError(const beast::error_code& ec, absl::string_view stage) const {
    if (ec == beast::error::timeout || absl::Now() >= deadline_) return Timeout(stage);
    if (ec == http::error::header_limit) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": the response headers are over ",
                                                     options_.max_header_bytes, " bytes"));
    }
    if (ec == http::error::body_limit) return TooLarge();
    if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
        ec == ssl::error::stream_truncated || ec == asio::error::eof ||
        ec == asio::error::connection_reset) {
      return absl::InvalidArgumentError(absl::StrCat(
          what_, ": the connection closed before the answer was complete (", stage, ")"));
    }
    if (ec.category() == http::make_error_code(http::error::end_of_stream).category()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, ": the answer is not valid HTTP/1.1 (", ec.message(), ")"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": ", stage, " failed (", ec.message(), ")"));
  }

  absl::Status TooLarge() const {
    return absl::InvalidArgumentError(absl::StrCat(what_, ": the image is over the limit of ",
                                                   options_.max_image_bytes, " bytes"));
  }

  // The addresses to connect to: the literal, or the name's every address; all of them public
  // unless the test override is set.
  absl::StatusOr<std::vector<IpAddress>> Addresses() const {
    std::vector<IpAddress> out;
    if (url_.ip.has_value()) {
      out.push_back(*url_.ip);
    } else {
      if (!options_.allow_private_addresses_for_tests &&
          (url_.host == "localhost" || absl::EndsWith(url_.host, ".localhost"))) {
        return absl::PermissionDeniedError(
            absl::StrCat(what_, " is a loopback name; only public addresses are fetched"));
      }
      const absl::Duration left = deadline_ - absl::Now();
      if (left <= absl::ZeroDuration()) return Timeout("DNS lookup");
      DnsOptions dns;
      dns.servers = options_.dns_servers;
      dns.timeout = left;
      ASSIGN_OR_RETURN(std::unique_ptr<DnsResolver> resolver, DnsResolver::Create(dns));
      // Absolute: the search list (a cluster's "svc.cluster.local") is never appended.
      absl::StatusOr<std::vector<std::string>> answer =
          resolver->Addresses(absl::StrCat(url_.host, "."));
      if (!answer.ok()) {
        if (absl::IsNotFound(answer.status())) {
          return absl::InvalidArgumentError(absl::StrCat(what_, " does not resolve"));
        }
        if (absl::Now() >= deadline_) return Timeout("DNS lookup");
        return absl::InvalidArgumentError(absl::StrCat(what_, " could not be resolved"));
      }
      for (const std::string& text : *answer) {
        std::optional<IpAddress> ip = ParseIpAddress(text);
        if (!ip.has_value()) {
          return absl::InvalidArgumentError(
              absl::StrCat(what_, " resolves to an address that could not be read"));
        }
        out.push_back(*ip);
      }
      if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(what_, " does not resolve"));
    }
    if (options_.allow_private_addresses_for_tests) return out;
    for (const IpAddress& ip : out) {
      const AddressClass c = ClassifyAddress(ip);
      if (c == AddressClass::kPublic) continue;
      // The class, not the address: the client learns nothing of the network it did not name.
      return absl::PermissionDeniedError(
          absl::StrCat(what_, url_.ip.has_value() ? " is a " : " resolves to a ",
                       AddressClassName(c), " address; only public addresses are fetched"));
    }
    return out;
  }

  // Connects `stream` to the first of `addresses` that answers.
  absl::Status Connect(asio::io_context& io, beast::tcp_stream& stream,
                       const std::vector<IpAddress>& addresses) const {
    stream.expires_at(SteadyDeadline(deadline_));
    beast::error_code ec;
    for (const IpAddress& ip : addresses) {
      ec = {};
      stream.async_connect(asio::ip::tcp::endpoint(ToAsio(ip), url_.port),
                           [&](beast::error_code e) { ec = e; });
      Await(io);
      if (!ec) return absl::OkStatus();
      if (ec == beast::error::timeout) return Timeout("connect");
      beast::error_code ignored;
      stream.socket().close(ignored);
    }
    return absl::InvalidArgumentError(
        absl::StrCat("could not connect to ", what_, " on port ", url_.port));
  }

  absl::Status Handshake(asio::io_context& io, beast::ssl_stream<beast::tcp_stream>& stream) const {
    SSL* native = stream.native_handle();
    X509_VERIFY_PARAM* param = SSL_get0_param(native);
    X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    ERR_clear_error();
    const bool named =
        url_.ip.has_value()
            ? X509_VERIFY_PARAM_set1_ip_asc(param, url_.host.c_str()) == 1
            : X509_VERIFY_PARAM_set1_host(param, url_.host.c_str(), url_.host.size()) == 1 &&
                  SSL_set_tlsext_host_name(native, url_.host.c_str()) == 1;
    if (!named) {
      return absl::InternalError(absl::StrCat("cannot set the TLS peer name: ", OpenSslErrors()));
    }
    beast::error_code ec;
    stream.async_handshake(ssl::stream_base::client, [&](beast::error_code e) { ec = e; });
    Await(io);
    if (!ec) return absl::OkStatus();
    const long verify = SSL_get_verify_result(native);
    if (verify != X509_V_OK) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": its TLS certificate is refused (",
                                                     X509_verify_cert_error_string(verify), ")"));
    }
    return TransportError(ec, "TLS handshake");
  }

  template <typename Stream>
  absl::StatusOr<std::string> Exchange(asio::io_context& io, Stream& stream) const {
    http::request<http::empty_body> request(http::verb::get, url_.target, 11);
    request.set(http::field::host, url_.HostHeader());
    request.set(http::field::user_agent, kUserAgent);
    request.set(http::field::accept, "image/*");
    request.set(http::field::connection, "close");
    beast::error_code ec;
    http::async_write(stream, request, [&](beast::error_code e, size_t) { ec = e; });
    Await(io);
    if (ec) return TransportError(ec, "sending the request");

    http::response_parser<http::string_body> parser;
    parser.header_limit(static_cast<uint32_t>(options_.max_header_bytes));
    // Checked below, once the status and type are known. (Not boost::none: Beast 1.74 compares
    // a Content-Length against the empty optional as over it.)
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    beast::flat_buffer buffer(static_cast<size_t>(options_.max_header_bytes) + (64 << 10));
    http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
    Await(io);
    if (ec) return TransportError(ec, "reading the response headers");

    const auto& header = parser.get();
    const unsigned code = header.result_int();
    if (code >= 300 && code < 400) {
      return absl::InvalidArgumentError(
          absl::StrCat(what_, " answered HTTP ", code,
                       " (a redirect): redirects are not followed; give the "
                       "image's final URL"));
    }
    if (code != 200) {
      return absl::InvalidArgumentError(absl::StrCat(what_, " answered HTTP ", code));
    }
    const absl::string_view encoding =
        absl::StripAsciiWhitespace(absl::string_view(header[http::field::content_encoding].data(),
                                                     header[http::field::content_encoding].size()));
    if (!encoding.empty() && !absl::EqualsIgnoreCase(encoding, "identity")) {
      return absl::InvalidArgumentError(absl::StrCat(what_, " answered with a Content-Encoding (",
                                                     encoding,
                                                     "); only unencoded images are taken"));
    }
    const auto type_field = header[http::field::content_type];
    absl::string_view type(type_field.data(), type_field.size());
    type = type.substr(0, type.find(';'));
    const std::string media = absl::AsciiStrToLower(absl::StripAsciiWhitespace(type));
    const bool image = absl::StartsWith(media, "image/") && media.size() > 6;
    const bool octet = options_.accept_octet_stream && media == "application/octet-stream";
    if (!image && !octet) {
      return absl::InvalidArgumentError(absl::StrCat(
          what_, " answered Content-Type '", media.substr(0, 64), "', not an image (image/*",
          options_.accept_octet_stream ? " or application/octet-stream" : "", ")"));
    }
    const boost::optional<uint64_t> length = parser.content_length();
    if (length.has_value() && *length > static_cast<uint64_t>(options_.max_image_bytes)) {
      return TooLarge();
    }
    parser.body_limit(static_cast<uint64_t>(options_.max_image_bytes));
    http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) { ec = e; });
    Await(io);
    if (ec && !(parser.is_done() && ec == ssl::error::stream_truncated)) {
      return TransportError(ec, "reading the image");
    }
    std::string body = std::move(parser.release().body());
    if (body.empty()) return absl::InvalidArgumentError(absl::StrCat(what_, " sent no bytes"));
    return body;
  }

 private:
  const RemoteImageFetcherOptions& options_;
  const ImageUrl url_;
  const absl::Time deadline_;
  const bool caller_deadline_;
  const std::string what_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RemoteImageFetcher>> RemoteImageFetcher::Create(
    RemoteImageFetcherOptions options) {
  if (options.max_image_bytes <= 0 || options.max_header_bytes <= 0 ||
      options.max_header_bytes > (1 << 30)) {
    return absl::InvalidArgumentError("remote image fetch: the byte caps must be positive");
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("remote image fetch: the timeout must be positive");
  }
  ASSIGN_OR_RETURN(HostAllowlist allowlist, HostAllowlist::Create(options.allowed_hosts));
  if (!options.dns_servers.empty()) {  // malformed servers fail here, not on each fetch
    DnsOptions dns;
    dns.servers = options.dns_servers;
    RETURN_IF_ERROR(DnsResolver::Create(dns).status());
  }
  auto tls = std::make_unique<Tls>();
  SSL_CTX* native = tls->ctx.native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(native, options.ca_file.c_str(), nullptr) != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "remote image fetch: cannot load the CA file ", options.ca_file, ": ", OpenSslErrors()));
  }
  tls->ctx.set_verify_mode(ssl::verify_peer);
  return std::unique_ptr<RemoteImageFetcher>(
      new RemoteImageFetcher(std::move(options), std::move(allowlist), std::move(tls)));
}

RemoteImageFetcher::RemoteImageFetcher(RemoteImageFetcherOptions options, HostAllowlist allowlist,
                                       std::unique_ptr<Tls> tls)
    : options_(std::move(options)), allowlist_(std::move(allowlist)), tls_(std::move(tls)) {}

RemoteImageFetcher::~RemoteImageFetcher() = default;

absl::StatusOr<std::string> RemoteImageFetcher::Fetch(const std::string& url, absl::Time deadline) {
  const absl::Time own = absl::Now() + options_.timeout;
  ASSIGN_OR_RETURN(ImageUrl parsed, ParseImageUrl(url));
  if (allowlist_.empty()) {
    return absl::PermissionDeniedError("remote image URLs are not enabled on this server");
  }
  if (!allowlist_.Allows(parsed.host)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "image URL host '", parsed.host, "' is not on this server's list of allowed image hosts"));
  }
  Call call(options_, std::move(parsed), std::min(deadline, own), deadline <= own);
  if (absl::Now() >= call.deadline()) return call.Timeout("before the lookup");
  ASSIGN_OR_RETURN(const std::vector<IpAddress> addresses, call.Addresses());

  asio::io_context io;
  if (call.url().https) {
    beast::ssl_stream<beast::tcp_stream> stream(io, tls_->ctx);
    RETURN_IF_ERROR(call.Connect(io, beast::get_lowest_layer(stream), addresses));
    RETURN_IF_ERROR(call.Handshake(io, stream));
    return call.Exchange(io, stream);
  }
  beast::tcp_stream stream(io);
  RETURN_IF_ERROR(call.Connect(io, stream, addresses));
  return call.Exchange(io, stream);
}

}  // namespace ferry
