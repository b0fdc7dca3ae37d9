#include "services/common/advertise_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status ValidateAdvertiseHost(absl::string_view flag, absl::string_view host) {
  if (IsWildcardHost(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " must name this host as its peers reach it (an IP or a name), not '", host, "'"));
  }
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_' || c == ':' || c == '[' || c == ']' ||
                    c == '%';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " '", host, "' is not a host name or an IP address"));
    }
  }
  const bool bracketed = absl::StartsWith(host, "[") && absl::EndsWith(host, "]");
  const size_t colons = std::count(host.begin(), host.end(), ':');
  if (!bracketed && colons == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", host,
                     "' must be a host without a port (the port is the one "
                     "the service binds)"));
  }
  return absl::OkStatus();
}

namespace {

absl::string_view Unbracketed(absl::string_view host) {
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host.remove_prefix(1);
    host.remove_suffix(1);
  }
  return host;
}

bool IsIpAddress(absl::string_view host) {
  const std::string h(Unbracketed(host));
  in_addr v4;
  in6_addr v6;
  return inet_pton(AF_INET, h.c_str(), &v4) == 1 || inet_pton(AF_INET6, h.c_str(), &v6) == 1;
}

// 127.0.0.0/8, ::1, localhost.
bool IsLoopbackHost(absl::string_view host) {
  const absl::string_view h = Unbracketed(host);
  return absl::StartsWith(h, "127.") || h == "::1" || h == "localhost";
}

}  // namespace

absl::Status CheckAdvertisable(absl::string_view flag, absl::string_view listen_address,
                               absl::string_view advertise_host) {
  const absl::string_view listen_host = HostOfAddress(listen_address);
  if (!advertise_host.empty() && IsLoopbackHost(listen_host) && IsIpAddress(advertise_host) &&
      !IsLoopbackHost(advertise_host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, " ", listen_address, " listens on loopback only, so peers cannot reach it at ",
        advertise_host, ": listen on that address or on every interface (0.0.0.0:PORT)"));
  }
  if (!advertise_host.empty() || !IsWildcardHost(listen_host)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      flag, " ", listen_address,
      " listens on every interface, so this process has no address of its own to tell its "
      "peers: set --advertise_address to the IP or name they reach it by (in Kubernetes the "
      "pod's IP: --advertise_address=$(POD_IP))"));
}

std::string AdvertisedAddress(absl::string_view bound_address, absl::string_view advertise_host) {
  if (advertise_host.empty()) return std::string(bound_address);
  const size_t colon = bound_address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(bound_address.substr(colon + 1), &port)) {
    return std::string(advertise_host);
  }
  return JoinHostPort(advertise_host, port);
}

}  // namespace ferry
