#include "engine/grammar/json_formats.h"

#include "absl/strings/str_cat.h"

namespace ferry::grammar {
namespace {

constexpr char kHex[] = "[0-9a-fA-F]";

std::string Date() {
  // Days per month: 01-28 everywhere; 29 and 30 except February; 31 in the long months.
  return "[0-9]{4} \"-\" ( (\"0\" [13578] | \"1\" [02]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" "
         "[01]) | (\"0\" [469] | \"11\") \"-\" (\"0\" [1-9] | [12] [0-9] | \"30\") | \"02-\" "
         "(\"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8]) )";
}

std::string Time() {
  return "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" "
         "[0-9]+)? (\"Z\" | [+\\x2D] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])";
}

std::string Ipv4() {
  const std::string octet =
      "(\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9])";
  return absl::StrCat(octet, " \".\" ", octet, " \".\" ", octet, " \".\" ", octet);
}

std::string Ipv6() {
  // RFC 3986's IPv6address: h16 is 1-4 hex digits; ls32 is h16:h16 or an IPv4 address.
  const std::string h16 = absl::StrCat(kHex, "{1,4}");
  const std::string h16c = absl::StrCat("(", h16, " \":\")");
  const std::string ls32 = absl::StrCat("(", h16, " \":\" ", h16, " | ", Ipv4(), ")");
  auto pre = [&](int n) {  // [ *n( h16 ":" ) h16 ]
    if (n < 0) return std::string();
    if (n == 0) return absl::StrCat("(", h16, ")?");
    return absl::StrCat("(", h16c, "{0,", n, "} ", h16, ")?");
  };
  std::string out = "(";
  absl::StrAppend(&out, h16c, "{6} ", ls32);
  absl::StrAppend(&out, " | \"::\" ", h16c, "{5} ", ls32);
  absl::StrAppend(&out, " | ", pre(0), " \"::\" ", h16c, "{4} ", ls32);
  absl::StrAppend(&out, " | ", pre(1), " \"::\" ", h16c, "{3} ", ls32);
  absl::StrAppend(&out, " | ", pre(2), " \"::\" ", h16c, "{2} ", ls32);
  absl::StrAppend(&out, " | ", pre(3), " \"::\" ", h16c, " ", ls32);
  absl::StrAppend(&out, " | ", pre(4), " \"::\" ", ls32);
  absl::StrAppend(&out, " | ", pre(5), " \"::\" ", h16);
  absl::StrAppend(&out, " | ", pre(6), " \"::\")");
  return out;
}

}  // namespace

std::optional<std::string> JsonFormatExpression(absl::string_view format) {
  if (format == "date") return Date();
  if (format == "time") return Time();
  if (format == "date-time") return absl::StrCat(Date(), " \"T\" ", Time());
  if (format == "uuid") {
    return absl::StrCat(kHex, "{8} \"-\" ", kHex, "{4} \"-\" ", kHex, "{4} \"-\" ", kHex,
                        "{4} \"-\" ", kHex, "{12}");
  }
  if (format == "email") {
    const std::string atom = "[a-zA-Z0-9!#$%&'*+/=?\\x5E_`{|}~\\x2D]+";
    const std::string label = "[a-zA-Z0-9] ([a-zA-Z0-9\\x2D]{0,61} [a-zA-Z0-9])?";
    return absl::StrCat(atom, " (\".\" ", atom, ")* \"@\" ", label, " (\".\" ", label, ")+");
  }
  if (format == "ipv4") return Ipv4();
  if (format == "ipv6") return Ipv6();
  return std::nullopt;
}

}  // namespace ferry::grammar
