#include "router/fetch/ip_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

namespace ferry {
namespace {

// True if the first `bits` bits of `a` and `prefix` agree.
bool InPrefix(const uint8_t* a, const uint8_t* prefix, int bits) {
  const int whole = bits / 8;
  if (std::memcmp(a, prefix, whole) != 0) return false;
  const int rest = bits % 8;
  if (rest == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[whole] & mask) == (prefix[whole] & mask);
}

struct Range4 {
  uint8_t prefix[4];
  int bits;
  AddressClass cls;
};

// IANA's IPv4 special-purpose registry, the entries that are not globally reachable unicast.
constexpr Range4 kRanges4[] = {
    {{0, 0, 0, 0}, 8, AddressClass::kUnspecified},
    {{10, 0, 0, 0}, 8, AddressClass::kPrivate},
    {{100, 64, 0, 0}, 10, AddressClass::kSharedCgnat},
    {{127, 0, 0, 0}, 8, AddressClass::kLoopback},
    {{169, 254, 0, 0}, 16, AddressClass::kLinkLocal},
    {{172, 16, 0, 0}, 12, AddressClass::kPrivate},
    {{192, 0, 0, 0}, 24, AddressClass::kReserved},
    {{192, 0, 2, 0}, 24, AddressClass::kDocumentation},
    {{192, 88, 99, 0}, 24, AddressClass::kReserved},
    {{192, 168, 0, 0}, 16, AddressClass::kPrivate},
    {{198, 18, 0, 0}, 15, AddressClass::kBenchmarking},
    {{198, 51, 100, 0}, 24, AddressClass::kDocumentation},
    {{203, 0, 113, 0}, 24, AddressClass::kDocumentation},
    {{224, 0, 0, 0}, 4, AddressClass::kMulticast},
    {{255, 255, 255, 255}, 32, AddressClass::kBroadcast},
    {{240, 0, 0, 0}, 4, AddressClass::kReserved},
};

AddressClass Classify4(const uint8_t* a) {
  for (const Range4& r : kRanges4) {
    if (InPrefix(a, r.prefix, r.bits)) return r.cls;
  }
  return AddressClass::kPublic;
}

constexpr uint8_t kZero[16] = {0};
constexpr uint8_t kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
constexpr uint8_t kNat64[12] = {0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0};
constexpr uint8_t kNat64Local[6] = {0, 0x64, 0xff, 0x9b, 0, 1};
constexpr uint8_t k6to4[2] = {0x20, 0x02};
constexpr uint8_t kDoc6[4] = {0x20, 0x01, 0x0d, 0xb8};
constexpr uint8_t kIetf6[3] = {0x20, 0x01, 0x00};  // 2001::/23
constexpr uint8_t kGlobal6[1] = {0x20};            // 2000::/3
constexpr uint8_t kUla6[1] = {0xfc};               // fc00::/7
constexpr uint8_t kLinkLocal6[2] = {0xfe, 0x80};   // fe80::/10
constexpr uint8_t kSiteLocal6[2] = {0xfe, 0xc0};   // fec0::/10
constexpr uint8_t kMulticast6[1] = {0xff};         // ff00::/8

AddressClass Classify6(const uint8_t* a) {
  if (std::memcmp(a, kZero, 16) == 0) return AddressClass::kUnspecified;
  if (std::memcmp(a, kLoopback6, 16) == 0) return AddressClass::kLoopback;
  if (InPrefix(a, kMapped, 96)) return Classify4(a + 12);
  if (InPrefix(a, kNat64, 96)) return Classify4(a + 12);
  if (InPrefix(a, k6to4, 16)) return Classify4(a + 2);
  if (InPrefix(a, kUla6, 7)) return AddressClass::kPrivate;
  if (InPrefix(a, kLinkLocal6, 10)) return AddressClass::kLinkLocal;
  if (InPrefix(a, kMulticast6, 8)) return AddressClass::kMulticast;
  if (InPrefix(a, kDoc6, 32)) return AddressClass::kDocumentation;
  if (InPrefix(a, kIetf6, 23)) return AddressClass::kReserved;
  // Everything else outside global unicast: IPv4-compatible ::/96, local NAT64, site-local,
  // discard-only 100::/64 and the unassigned space.
  if (InPrefix(a, kNat64Local, 48) || InPrefix(a, kSiteLocal6, 10) || !InPrefix(a, kGlobal6, 3)) {
    return AddressClass::kReserved;
  }
  return AddressClass::kPublic;
}

}  // namespace

std::string IpAddress::ToString() const {
  char text[INET6_ADDRSTRLEN] = {0};
  if (inet_ntop(v6 ? AF_INET6 : AF_INET, bytes.data(), text, sizeof(text)) == nullptr) return "";
  return text;
}

std::optional<IpAddress> ParseIpAddress(absl::string_view text) {
  if (text.empty() || text.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  const std::string s(text);
  IpAddress out;
  if (inet_pton(AF_INET, s.c_str(), out.bytes.data()) == 1) {
    // glibc's inet_pton takes exactly four decimal parts; refuse leading zeros, which other
    // parsers read as octal.
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      if (s[i] == '0' && (i == 0 || s[i - 1] == '.') && s[i + 1] != '.') return std::nullopt;
    }
    return out;
  }
  if (s.find('%') == std::string::npos && inet_pton(AF_INET6, s.c_str(), out.bytes.data()) == 1) {
    out.v6 = true;
    return out;
  }
  return std::nullopt;
}

AddressClass ClassifyAddress(const IpAddress& address) {
  return address.v6 ? Classify6(address.bytes.data()) : Classify4(address.bytes.data());
}

absl::string_view AddressClassName(AddressClass c) {
  switch (c) {
    case AddressClass::kPublic:
      return "public";
    case AddressClass::kUnspecified:
      return "unspecified";
    case AddressClass::kLoopback:
      return "loopback";
    case AddressClass::kPrivate:
      return "private";
    case AddressClass::kSharedCgnat:
      return "shared (carrier-grade NAT)";
    case AddressClass::kLinkLocal:
      return "link-local";
    case AddressClass::kMulticast:
      return "multicast";
    case AddressClass::kBroadcast:
      return "broadcast";
    case AddressClass::kReserved:
      return "reserved";
    case AddressClass::kBenchmarking:
      return "benchmarking";
    case AddressClass::kDocumentation:
      return "documentation";
  }
  return "unknown";
}

}  // namespace ferry
