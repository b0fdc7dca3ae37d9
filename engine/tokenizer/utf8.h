// UTF-8 helpers for the tokenizer: validation, the byte-level alphabet of GPT-2-style BPE, and
// lossy conversion that matches Rust's String::from_utf8_lossy (what HF `tokenizers` returns when
// decoded bytes are not valid UTF-8).

#ifndef FERRY_ENGINE_TOKENIZER_UTF8_H_
#define FERRY_ENGINE_TOKENIZER_UTF8_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

// Length of the longest prefix of `s` that is valid UTF-8 (s.size() when all of it is).
size_t ValidUtf8Prefix(absl::string_view s);
inline bool IsValidUtf8(absl::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

// Length of an incomplete but so-far-valid UTF-8 sequence at the end of `s` (0, 1, 2 or 3):
// the bytes to hold back while streaming.
size_t IncompleteUtf8Suffix(absl::string_view s);

// Replaces each maximal invalid subsequence with U+FFFD, as Rust's from_utf8_lossy does.
std::string Utf8Lossy(absl::string_view s);

void AppendUtf8(char32_t code_point, std::string* out);

// Decodes the code point at s[*pos] (valid UTF-8 assumed) and advances *pos.
char32_t NextCodePoint(absl::string_view s, size_t* pos);

// GPT-2's byte-level alphabet: byte b <-> a printable code point (bytes_to_unicode()).
char32_t ByteToUnicode(uint8_t byte);
// The byte for a code point of that alphabet; -1 if the code point is not in it.
int UnicodeToByte(char32_t code_point);

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_UTF8_H_
