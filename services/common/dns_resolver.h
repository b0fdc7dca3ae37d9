// DNS lookups for discovery (ARCHITECTURE.md §7 Registry): the addresses behind a name (the A and
// AAAA records of a Kubernetes headless Service: one per pod) and the name behind an address (its
// PTR record: a StatefulSet pod's stable name). Through c-ares, so that the servers, the search
// list and the time a lookup may take are the resolver's own and not the C library's.
//
//   auto dns = DnsResolver::Create({});  // /etc/resolv.conf: its servers, search list, ndots
//   auto ips = (*dns)->Addresses("ferry-decode");       // {"10.0.3.7", "10.0.5.2"}
//   auto name = (*dns)->NameOf("10.0.3.7");  // "ferry-kvstore-0.ferry-kvstore.ferry.svc..."
//
// Without servers in DnsOptions, c-ares reads /etc/resolv.conf (servers, `search`, `ndots`,
// `options timeout/attempts`) and /etc/hosts, as the C library would. With servers, only those are
// asked, over UDP then TCP, and /etc/hosts is not read; "ip" or "ip:port" ("[v6]:port"), so that a
// test's DNS server may listen on a high port.
//
// Errors: NotFound when the name (or the address's PTR) has no record: an answer, e.g. a pool
// scaled to zero. Unavailable when no answer came: a timeout, a refused or failing server, a
// lookup past DnsOptions::timeout. InvalidArgument for a malformed name or address.
//
// Thread-safe: each lookup runs on a c-ares channel of its own (a copy of the configured one), on
// the calling thread, and blocks it for at most DnsOptions::timeout.

#ifndef FERRY_SERVICES_COMMON_DNS_RESOLVER_H_
#define FERRY_SERVICES_COMMON_DNS_RESOLVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/common/host_port.h"

namespace ferry {

struct DnsOptions {
  // "ip" or "ip:port" ("[ipv6]:port"), asked in order; empty: the system's (/etc/resolv.conf).
  std::vector<std::string> servers;
  // A lookup's whole time at most (every server, every try, every search domain).
  absl::Duration timeout = absl::Seconds(2);
};

class DnsResolver {
 public:
  // InvalidArgument for a malformed server; Internal if c-ares cannot start.
  static absl::StatusOr<std::unique_ptr<DnsResolver>> Create(const DnsOptions& options);
  ~DnsResolver();
  DnsResolver(const DnsResolver&) = delete;
  DnsResolver& operator=(const DnsResolver&) = delete;

  // The IPv4 and IPv6 addresses of `name` (search list applied as the system's resolver would),
  // textual, sorted, without duplicates.
  absl::StatusOr<std::vector<std::string>> Addresses(absl::string_view name) const;

  // The name an address's PTR record gives (no trailing dot).
  absl::StatusOr<std::string> NameOf(absl::string_view address) const;

 private:
  struct Channel;
  DnsResolver(const DnsOptions& options, std::unique_ptr<Channel> channel);

  const DnsOptions options_;
  std::unique_ptr<Channel> configured_;  // copied for each lookup (ares_dup)
};

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_DNS_RESOLVER_H_
