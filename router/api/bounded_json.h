// JSON text parsed into nlohmann::ordered_json in time linear in its size, with bounds enforced
// while it is parsed: the nesting depth, the keys and array elements in all, and each string's
// (and key's) length. The first excess stops the parse with an error that names the limit and
// where in the document it was met, before anything more is read or stored.
//
// Why not ordered_json::parse: its objects are vectors that insert a key after a linear scan for
// a duplicate, so an object of n keys takes n^2/2 string comparisons (50,000 keys: seconds).
// Here each object's members are appended to its vector directly, and duplicates are found with
// a hash index of the object's keys while it is open (objects of a few keys are scanned).
//
// Duplicate keys (RFC 8259 leaves their meaning open): the last value wins, at the position of
// the key's first occurrence. That is what ordered_json::parse gave before and what Python's
// json.loads gives (its dicts keep a key where it was first inserted), so a client whose body
// repeats a key gets the answer it got from OpenAI's Python servers and from this router before.
// Each occurrence counts toward max_values.
//
// Lookups of fixed keys in the result stay what ordered_json's are (a scan of the object):
// callers read a constant number of keys from each object, or walk it once.
//
// Pure functions; thread-safe.

#ifndef FERRY_ROUTER_API_BOUNDED_JSON_H_
#define FERRY_ROUTER_API_BOUNDED_JSON_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ferry {

// The defaults are the router's for its default --max_body_bytes of 8 MiB (request_json.h
// RequestJsonLimits derives them from the body limit and the model's context).
struct JsonLimits {
  // Containers open at once: the document itself is depth 1. Copying, dumping and destroying a
  // value recurse over its levels.
  int max_depth = 128;
  // Object keys plus array elements, in the whole document (the top-level value not counted).
  uint64_t max_values = uint64_t{1} << 20;
  // Bytes of one string or key, as decoded.
  uint64_t max_string_bytes = uint64_t{8} << 20;
};

// Why a parse failed.
struct JsonParseError {
  enum class Kind { kNone, kSyntax, kDepth, kValues, kStringBytes };
  Kind kind = Kind::kNone;
  // Where: the path of the container (or of the string) at which the limit was met, as
  // "messages[3].content" ("" for the top level; empty for syntax errors).
  std::string path;
  // What, for people: nlohmann's message for a syntax error; the limit and its value otherwise.
  std::string message;
};

// Parses `text` into `*out`. On failure returns InvalidArgument (its message is error->message)
// and fills `error` when it is not null; `*out` is then unspecified.
absl::Status ParseBoundedJson(absl::string_view text, const JsonLimits& limits,
                              nlohmann::ordered_json* out, JsonParseError* error = nullptr);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_BOUNDED_JSON_H_
