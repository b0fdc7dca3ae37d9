// Fuzz target for the remote image URL parser (image_url.h) and the allowlist built on it: any
// bytes parse or are refused with a message; what parses is printable ASCII throughout, its host
// is lower case, an IP literal parses back to the same address, and the normalized URL parses
// again to itself (nothing downstream reads a different URL from the one checked).

#include <cstddef>
#include <cstdint>
#include <string>

#include "router/fetch/host_allowlist.h"
#include "router/fetch/image_url.h"

namespace {

bool Printable(const std::string& s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ferry::ImageUrl> url = ferry::ParseImageUrl(text);
  if (!url.ok()) {
    if (url.status().message().empty()) __builtin_trap();
  } else {
    const std::string normal = url->ToString();
    if (!Printable(normal) || url->host.empty() || url->target.empty() || url->target[0] != '/' ||
        url->port == 0) {
      __builtin_trap();
    }
    for (char c : url->host) {
      if (c >= 'A' && c <= 'Z') __builtin_trap();
    }
    if (url->ip.has_value() && url->ip->ToString() != url->host) __builtin_trap();
    absl::StatusOr<ferry::ImageUrl> again = ferry::ParseImageUrl(normal);
    if (!again.ok() || again->ToString() != normal || again->host != url->host ||
        again->port != url->port || again->https != url->https) {
      __builtin_trap();
    }
  }
  // The same bytes as an allowlist pattern: taken (then not empty) or refused, never a crash.
  absl::StatusOr<ferry::HostAllowlist> list = ferry::HostAllowlist::Create({text});
  if (list.ok() && list->empty()) __builtin_trap();
  return 0;
}
