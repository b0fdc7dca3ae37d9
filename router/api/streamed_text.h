// What the reply parsers (tool_call_parser.h, reasoning_parser.h) share about text that arrives
// in pieces: where a piece may end without cutting a UTF-8 character, and how much of its end may
// still become a marker.
//
// Pure functions.

#ifndef FERRY_ROUTER_API_STREAMED_TEXT_H_
#define FERRY_ROUTER_API_STREAMED_TEXT_H_

#include <algorithm>
#include <cstddef>

#include "absl/strings/string_view.h"

namespace ferry {

// The longest prefix of `s` that does not end inside a UTF-8 character (bytes that cannot start
// or continue one count as complete: they are passed on, not held forever).
inline size_t Utf8SafeLength(absl::string_view s) {
  size_t start = s.size();
  for (int back = 0; back < 4 && start > 0; ++back) {
    --start;
    const auto c = static_cast<unsigned char>(s[start]);
    if ((c & 0xC0) != 0x80) {  // the last character's first byte
      const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      return s.size() - start >= need ? s.size() : start;
    }
  }
  return s.size();
}

// How many bytes at the end of `s` could begin `marker` (to be held until the next piece).
inline size_t MarkerPrefixAtEnd(absl::string_view s, absl::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

// Whether `s` is a proper prefix of `marker` (more text may complete it).
inline bool CouldBegin(absl::string_view s, absl::string_view marker) {
  return s.size() < marker.size() && marker.substr(0, s.size()) == s;
}

}  // namespace ferry

#endif  // FERRY_ROUTER_API_STREAMED_TEXT_H_
