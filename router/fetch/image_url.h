// The strict parser of a remote image URL (an `image_url` the API client gave): only
// `http://` and `https://`, a host that is a DNS name of ASCII letters, digits and hyphens, a
// canonical dotted-quad IPv4 address or a bracketed IPv6 address, an optional port, and a path and
// query of printable ASCII. The fetcher (remote_image_fetcher.h) takes what this returns; it never
// sees the URL text again, so nothing here is re-parsed differently downstream.
//
// Refused, each with an InvalidArgument naming the rule: other schemes; user info
// ("user@host"); an empty host; a non-ASCII host (internationalized names must be given in their
// IDNA "xn--" form: no IDNA conversion is done here); percent-encoded or otherwise odd host
// characters; a numeric host in any form but a canonical dotted quad ("2130706433", "0x7f.1",
// "127.1", "0177.0.0.1": the forms other resolvers read as IPv4); an IPv6 zone id; a port that is
// empty, not decimal, 0 or over 65535; whitespace, control characters, backslashes or non-ASCII
// bytes anywhere; a malformed percent escape; a URL over `max_length`. A fragment ("#...") is
// dropped (it is never sent to a server). A single trailing dot of the host is dropped.
//
// Pure functions; thread-safe.

#ifndef FERRY_ROUTER_FETCH_IMAGE_URL_H_
#define FERRY_ROUTER_FETCH_IMAGE_URL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "router/fetch/ip_address.h"

namespace ferry {

struct ImageUrl {
  bool https = false;
  std::string host;             // lower case; an IP literal's canonical text, v6 unbracketed
  std::optional<IpAddress> ip;  // set when the host is an IP literal (no DNS lookup then)
  uint16_t port = 0;            // the explicit port, or 80 / 443
  bool explicit_port = false;
  std::string target;  // the request target: path and query, "/" at least

  // The Host header's value: "example.com", "example.com:8080", "[2001:db8::1]:8443".
  std::string HostHeader() const;
  // The URL as it will be fetched (no fragment, host normalized), for logs and errors.
  std::string ToString() const;
};

inline constexpr size_t kMaxImageUrlLength = 8192;

absl::StatusOr<ImageUrl> ParseImageUrl(absl::string_view url,
                                       size_t max_length = kMaxImageUrlLength);

}  // namespace ferry

#endif  // FERRY_ROUTER_FETCH_IMAGE_URL_H_
