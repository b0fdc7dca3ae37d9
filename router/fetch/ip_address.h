// An IP address as remote image fetching sees it: the 4 or 16 bytes of a literal or of a DNS
// answer, parsed strictly (inet_pton: dotted-quad IPv4 only, no zone ids), and the class of
// address it is, so that the fetcher refuses every address that is not public unicast
// (ARCHITECTURE.md §6: a remote image URL is a server-side request forgery surface).
//
// ClassifyAddress is a pure function over the bytes: the table of ranges is below, the
// embedded IPv4 address of an IPv4-mapped, NAT64 (64:ff9b::/96) or 6to4 (2002::/16) IPv6 address
// is classified as IPv4, and every IPv6 address outside 2000::/3 (global unicast) that is not one
// of those forms is refused. Thread-compatible values; functions are thread-safe.

#ifndef FERRY_ROUTER_FETCH_IP_ADDRESS_H_
#define FERRY_ROUTER_FETCH_IP_ADDRESS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

struct IpAddress {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};  // IPv4: the first 4 bytes, network order

  // The canonical text (inet_ntop): "192.0.2.1", "2001:db8::1" (no brackets).
  std::string ToString() const;
};

// Strict: an IPv4 dotted quad ("127.0.0.1"; not "127.1", "0x7f.0.0.1", "2130706433", "0127.0.0.1")
// or an IPv6 address without brackets or zone ("::ffff:127.0.0.1"). nullopt for anything else.
std::optional<IpAddress> ParseIpAddress(absl::string_view text);

enum class AddressClass {
  kPublic = 0,     // global unicast: may be fetched from
  kUnspecified,    // 0.0.0.0/8, ::/128
  kLoopback,       // 127.0.0.0/8, ::1/128
  kPrivate,        // 10/8, 172.16/12, 192.168/16, fc00::/7 (unique local)
  kSharedCgnat,    // 100.64.0.0/10 (carrier-grade NAT)
  kLinkLocal,      // 169.254.0.0/16 (cloud metadata: 169.254.169.254), fe80::/10
  kMulticast,      // 224.0.0.0/4, ff00::/8
  kBroadcast,      // 255.255.255.255
  kReserved,       // 240.0.0.0/4, 192.0.0.0/24, 192.88.99.0/24, fec0::/10 (site-local),
                   // 2001::/23 (IETF protocol assignments: Teredo, ORCHID, benchmarking...),
                   // 64:ff9b:1::/48 (local NAT64), ::/96 (IPv4-compatible), 100::/64 (discard)
                   // and every IPv6 address outside 2000::/3
  kBenchmarking,   // 198.18.0.0/15
  kDocumentation,  // 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32
};

// The class of `address`; an IPv4-mapped (::ffff:0:0/96), NAT64 (64:ff9b::/96) or 6to4
// (2002::/16) address has the class of the IPv4 address it carries.
AddressClass ClassifyAddress(const IpAddress& address);

// "loopback", "private", "link-local", ...: for error messages.
absl::string_view AddressClassName(AddressClass c);

}  // namespace ferry

#endif  // FERRY_ROUTER_FETCH_IP_ADDRESS_H_
