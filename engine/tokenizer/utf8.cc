#include "engine/tokenizer/utf8.h"

#include <array>

namespace ferry {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 if invalid; *need = how many bytes a valid
// sequence would have needed when s ends early (for the incomplete-suffix check).
size_t ValidSequenceAt(absl::string_view s, size_t i, size_t* max_valid_prefix) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  *max_valid_prefix = 0;
  if (c < 0x80) return 1;
  size_t len;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (c >= 0xc2 && c <= 0xdf) {
    len = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    len = 3;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    len = 4;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  size_t k = 1;
  for (; k < len && i + k < s.size(); ++k) {
    const unsigned char ck = b(k);
    const unsigned char klo = k == 1 ? lo : 0x80, khi = k == 1 ? hi : 0xbf;
    if (ck < klo || ck > khi) {
      *max_valid_prefix = k;
      return 0;
    }
  }
  if (k < len) {
    *max_valid_prefix = k;  // ran out of input: a valid but incomplete prefix
    return 0;
  }
  return len;
}

const std::array<char32_t, 256>& ByteTable() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
      t[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
    }
    return t;
  }();
  return table;
}

}  // namespace

size_t ValidUtf8Prefix(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t prefix;
    const size_t len = ValidSequenceAt(s, i, &prefix);
    if (len == 0) return i;
    i += len;
  }
  return i;
}

size_t IncompleteUtf8Suffix(absl::string_view s) {
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t i = s.size() - back;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c & 0xc0) == 0x80) continue;  // continuation byte: look further back
    size_t prefix;
    if (ValidSequenceAt(s, i, &prefix) == 0 && prefix == back) return back;
    return 0;
  }
  return 0;
}

std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t prefix;
    const size_t len = ValidSequenceAt(s, i, &prefix);
    if (len > 0) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out.append("\xef\xbf\xbd");
      i += prefix > 0 ? prefix : 1;
    }
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const unsigned char c = static_cast<unsigned char>(s[*pos]);
  int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : 4;
  char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < len && *pos + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3f);
  }
  *pos += len;
  return cp;
}

char32_t ByteToUnicode(uint8_t byte) { return ByteTable()[byte]; }

int UnicodeToByte(char32_t cp) {
  static const std::array<int, 324> inverse = [] {
    std::array<int, 324> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[ByteTable()[b]] = b;
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

}  // namespace ferry
