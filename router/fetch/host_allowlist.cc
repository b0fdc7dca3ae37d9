#include "router/fetch/host_allowlist.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "router/fetch/image_url.h"

namespace ferry {

absl::StatusOr<HostAllowlist> HostAllowlist::Create(const std::vector<std::string>& patterns) {
  HostAllowlist out;
  for (const std::string& pattern : patterns) {
    absl::string_view p = pattern;
    const bool suffix = absl::ConsumePrefix(&p, "*.");
    // The same host rules as a URL's: parse "http://<pattern>/" and take its host.
    const bool bare_v6 = !p.empty() && p.front() != '[' && absl::StrContains(p, ":");
    absl::StatusOr<ImageUrl> url = ParseImageUrl(bare_v6 ? absl::StrCat("http://[", p, "]/")
                                                         : absl::StrCat("http://", p, "/"));
    const bool plain_host = url.ok() && !url->explicit_port && url->target == "/";
    if (!plain_host) {
      return absl::InvalidArgumentError(absl::StrCat(
          "image URL allowlist: '", pattern,
          "' is not a host name, '*.' and a domain, or an IP address (no scheme, port or path)"));
    }
    if (suffix) {
      if (url->ip.has_value() || url->host.find('.') == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat("image URL allowlist: '", pattern,
                         "': a '*.' pattern needs a domain of at least two labels"));
      }
      out.suffixes_.push_back(absl::StrCat(".", url->host));
    } else {
      out.exact_.push_back(url->host);
    }
  }
  return out;
}

bool HostAllowlist::Allows(absl::string_view host) const {
  if (std::find(exact_.begin(), exact_.end(), host) != exact_.end()) return true;
  for (const std::string& s : suffixes_) {
    if (host.size() > s.size() && absl::EndsWith(host, s)) return true;
  }
  return false;
}

}  // namespace ferry
