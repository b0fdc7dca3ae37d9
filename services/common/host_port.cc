#include "services/common/host_port.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ferry {

absl::Status SplitHostPort(absl::string_view endpoint, std::string* host, int* port) {
  absl::string_view h, p;
  if (absl::ConsumePrefix(&endpoint, "[")) {
    const size_t close = endpoint.find("]:");
    if (close == endpoint.npos) {
      return absl::InvalidArgumentError(absl::StrCat("'[", endpoint, "': want [host]:port"));
    }
    h = endpoint.substr(0, close);
    p = endpoint.substr(close + 2);
  } else {
    const size_t colon = endpoint.rfind(':');
    if (colon == endpoint.npos || endpoint.find(':') != colon) {
      return absl::InvalidArgumentError(absl::StrCat("'", endpoint, "': want host:port"));
    }
    h = endpoint.substr(0, colon);
    p = endpoint.substr(colon + 1);
  }
  int value = 0;
  if (h.empty() || !absl::SimpleAtoi(p, &value) || value < 1 || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", endpoint, "': want host:port with a port in 1..65535"));
  }
  *host = std::string(h);
  *port = value;
  return absl::OkStatus();
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (host.find(':') != host.npos && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::string_view HostOfAddress(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    return close == absl::string_view::npos ? address : address.substr(0, close + 1);
  }
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return address;
  if (address.find(':') != colon) return address;  // a bare IPv6 address, no port
  return address.substr(0, colon);
}

bool IsWildcardHost(absl::string_view host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]";
}

}  // namespace ferry
