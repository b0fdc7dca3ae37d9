// A JSON string literal written straight into a buffer: what the streaming writers use for the
// one value that changes in every event of a stream (a chunk's text), so that an event is a
// template's prefix, the escaped text and its suffix instead of a JSON document built and dumped.
//
// AppendJsonString writes exactly what nlohmann::json's dump(-1, ' ', false,
// error_handler_t::replace) writes for the same string (quotes included): `"` and `\` escaped,
// \b \f \n \r \t as short escapes, other control characters below 0x20 as \u00xx (lowercase
// hex), everything else (UTF-8 included) as it is. It refuses text that is not valid UTF-8
// (false, nothing appended): the caller takes nlohmann's path, which replaces it.
//
// Pure functions; thread-safe.

#ifndef FERRY_ROUTER_API_JSON_STRING_H_
#define FERRY_ROUTER_API_JSON_STRING_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF).
bool IsValidUtf8(absl::string_view text);

// Appends `text` as a JSON string literal to `out`; false (and `out` unchanged) when `text` is
// not valid UTF-8.
bool AppendJsonString(absl::string_view text, std::string* out);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_JSON_STRING_H_
