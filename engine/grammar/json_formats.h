// JSON Schema `format` values as GBNF: the content (between the quotes) of a JSON string in the
// format. All are ASCII and need no JSON escapes.
//
//   date       RFC 3339 full-date: YYYY-MM-DD, day within the month's length (February up to
//              28: the 29th, valid in leap years only, is never produced).
//   time       RFC 3339 full-time: HH:MM:SS, optional fraction, then Z or +HH:MM / -HH:MM
//              (seconds 00-59: no leap second; upper-case Z only).
//   date-time  date "T" time (upper-case T only).
//   uuid       8-4-4-4-12 hex digits (either case).
//   email      dot-atom local part "@" a domain of dot-separated letter/digit/hyphen labels
//              (a strict subset of RFC 5321: no quoted local parts, no address literals).
//   ipv4       dotted quad, each 0-255 without leading zeros.
//   ipv6       RFC 4291 text form, "::" compression and an IPv4 tail included (no zone id).
//
// Pure functions; thread-safe.

#ifndef FERRY_ENGINE_GRAMMAR_JSON_FORMATS_H_
#define FERRY_ENGINE_GRAMMAR_JSON_FORMATS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry::grammar {

// The GBNF expression for `format`'s content, or nullopt for a format not supported.
std::optional<std::string> JsonFormatExpression(absl::string_view format);

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_JSON_FORMATS_H_
