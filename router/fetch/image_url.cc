#include "router/fetch/image_url.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ferry {
namespace {

absl::Status Bad(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("invalid image URL: ", why));
}

bool IsHex(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// A label that other URL parsers (WHATWG's, inet_aton's) would read as a number: all decimal
// digits, or "0x" followed by hex digits.
bool NumericLabel(absl::string_view label) {
  if (label.empty()) return false;
  if (label.size() >= 2 && label[0] == '0' && (label[1] == 'x' || label[1] == 'X')) {
    for (char c : label.substr(2)) {
      if (!IsHex(c)) return false;
    }
    return true;
  }
  for (char c : label) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

absl::Status ParseHost(absl::string_view host_text, ImageUrl* out) {
  if (host_text.empty()) return Bad("the host is empty");
  if (host_text.front() == '[') {
    if (host_text.back() != ']') return Bad("an IPv6 host must end with ']'");
    const absl::string_view inner = host_text.substr(1, host_text.size() - 2);
    if (inner.find('%') != inner.npos) return Bad("an IPv6 zone id is not allowed");
    std::optional<IpAddress> ip = ParseIpAddress(inner);
    if (!ip.has_value() || !ip->v6) return Bad("the bracketed host is not an IPv6 address");
    out->ip = ip;
    out->host = ip->ToString();
    return absl::OkStatus();
  }
  if (host_text.find_first_of("[]") != host_text.npos) return Bad("a stray '[' or ']' in the host");
  std::string host = absl::AsciiStrToLower(host_text);
  if (absl::EndsWith(host, ".")) host.pop_back();
  if (host.empty()) return Bad("the host is empty");
  if (host.size() > 253) return Bad("the host name is over 253 characters");
  for (char c : host) {
    const bool ok = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.';
    if (!ok) {
      return Bad(absl::StrCat("the host holds '", std::string(1, c),
                              "': a host is letters, digits, '-' and '.' (or [IPv6])"));
    }
  }
  const std::vector<absl::string_view> labels = absl::StrSplit(host, '.');
  for (absl::string_view label : labels) {
    if (label.empty()) return Bad("the host has an empty label ('..')");
    if (label.size() > 63) return Bad("a host label is over 63 characters");
    if (label.front() == '-' || label.back() == '-') {
      return Bad("a host label starts or ends with '-'");
    }
  }
  if (NumericLabel(labels.back())) {
    // An IPv4 literal; only its canonical form is taken, so that no other parser (the C
    // library's inet_aton, a proxy's) reads a different address from the same text.
    std::optional<IpAddress> ip = ParseIpAddress(host);
    if (!ip.has_value() || ip->v6) {
      return Bad(absl::StrCat("the numeric host '", host,
                              "' is not a canonical dotted-quad IPv4 address"));
    }
    out->ip = ip;
  }
  out->host = std::move(host);
  return absl::OkStatus();
}

}  // namespace

std::string ImageUrl::HostHeader() const {
  const std::string h = (ip.has_value() && ip->v6) ? absl::StrCat("[", host, "]") : host;
  return explicit_port ? absl::StrCat(h, ":", port) : h;
}

std::string ImageUrl::ToString() const {
  return absl::StrCat(https ? "https://" : "http://", HostHeader(), target);
}

absl::StatusOr<ImageUrl> ParseImageUrl(absl::string_view url, size_t max_length) {
  if (url.size() > max_length) {
    return Bad(absl::StrCat("the URL is over ", max_length, " characters"));
  }
  ImageUrl out;
  const size_t colon = url.find(':');
  if (colon == url.npos) return Bad("no scheme (http:// or https://)");
  const std::string scheme = absl::AsciiStrToLower(url.substr(0, colon));
  if (scheme == "https") {
    out.https = true;
  } else if (scheme != "http") {
    return Bad(absl::StrCat("the scheme must be http or https"));
  }
  absl::string_view rest = url.substr(colon + 1);
  if (!absl::ConsumePrefix(&rest, "//")) return Bad("the scheme must be followed by '//'");
  const size_t hash = rest.find('#');
  if (hash != rest.npos) rest = rest.substr(0, hash);  // the fragment is the client's own
  for (char c : rest) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      const size_t end = rest.find_first_of("/?");
      if (rest.substr(0, end).find(c) != rest.npos) {
        return Bad("a non-ASCII host: give an internationalized name in its IDNA (xn--) form");
      }
      return Bad("a non-ASCII character: percent-encode it");
    }
    if (u <= 0x20 || u == 0x7f) return Bad("whitespace or a control character");
    if (c == '\\') return Bad("a backslash");
  }
  const size_t authority_end = rest.find_first_of("/?");
  const absl::string_view authority = rest.substr(0, authority_end);
  absl::string_view tail = authority_end == rest.npos ? "" : rest.substr(authority_end);
  if (authority.find('@') != authority.npos) return Bad("user info ('user@host') is not allowed");
  if (authority.find('%') != authority.npos) return Bad("a percent-encoded host");

  absl::string_view host_text = authority;
  absl::string_view port_text;
  bool has_port = false;
  const size_t bracket = authority.rfind(']');
  const size_t port_colon = authority.rfind(':');
  if (port_colon != authority.npos && (bracket == authority.npos || port_colon > bracket)) {
    host_text = authority.substr(0, port_colon);
    port_text = authority.substr(port_colon + 1);
    has_port = true;
  }
  if (!host_text.empty() && host_text.front() != '[' && host_text.find(':') != host_text.npos) {
    return Bad("an IPv6 host must be in brackets");
  }
  if (absl::Status s = ParseHost(host_text, &out); !s.ok()) return s;
  if (has_port) {
    int port = 0;
    bool digits = !port_text.empty() && port_text.size() <= 5;
    for (char c : port_text) digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
    if (!digits || !absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535) {
      return Bad("the port must be a number from 1 to 65535");
    }
    out.port = static_cast<uint16_t>(port);
    out.explicit_port = true;
  } else {
    out.port = out.https ? 443 : 80;
  }

  for (size_t i = 0; i < tail.size(); ++i) {
    if (tail[i] == '%' && (i + 2 >= tail.size() || !IsHex(tail[i + 1]) || !IsHex(tail[i + 2]))) {
      return Bad("a '%' not followed by two hex digits");
    }
  }
  if (tail.empty() || tail.front() == '?') {
    out.target = absl::StrCat("/", tail);
  } else {
    out.target = std::string(tail);
  }
  return out;
}

}  // namespace ferry
