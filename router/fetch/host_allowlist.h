// The operator's list of hosts remote image URLs may name (--image_url_allowed_hosts): exact
// host names ("images.example.com"), suffix patterns ("*.example.com": any name that ends in
// ".example.com", not "example.com" itself) and exact IP literals ("203.0.113.7",
// "[2001:db8::1]" or "2001:db8::1"). Matching is on the host ImageUrl gives (lower case, no
// trailing dot); a pattern is normalized the same way. The allowlist says which names a client
// may ask for; it does not make a private address fetchable (the address check comes after).
//
// Immutable after Create; thread-safe.

#ifndef FERRY_ROUTER_FETCH_HOST_ALLOWLIST_H_
#define FERRY_ROUTER_FETCH_HOST_ALLOWLIST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

class HostAllowlist {
 public:
  // InvalidArgument, naming the pattern, for a pattern that is not a host name, "*." + a host
  // name with at least two labels ("*.com" is refused: a whole top-level domain), or an IP
  // literal.
  static absl::StatusOr<HostAllowlist> Create(const std::vector<std::string>& patterns);

  // True if `host` (ImageUrl::host) is listed or matches a suffix pattern.
  bool Allows(absl::string_view host) const;
  bool empty() const { return exact_.empty() && suffixes_.empty(); }

 private:
  std::vector<std::string> exact_;
  std::vector<std::string> suffixes_;  // ".example.com"
};

}  // namespace ferry

#endif  // FERRY_ROUTER_FETCH_HOST_ALLOWLIST_H_
