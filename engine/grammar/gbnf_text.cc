#include "engine/grammar/gbnf_text.h"

#include <algorithm>
#include <cstdio>

#include "engine/tokenizer/utf8.h"

namespace ferry::grammar {
namespace {

// Appends `cp` as GBNF would read it back: printable ASCII as itself (escaping the characters in
// `specials` with a backslash), everything else escaped.
void AppendEscaped(uint32_t cp, absl::string_view specials, std::string* out) {
  char buf[16];
  const bool special = cp < 0x80 && specials.find(static_cast<char>(cp)) != absl::string_view::npos;
  // llama.cpp's GBNF knows only the escapes \x \u \U \t \r \n \\ \" \[ \]: other special
  // characters ('^' and '-' in a class) are written in hex.
  if (special && cp != '"' && cp != '\\' && cp != '[' && cp != ']') {
    std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned>(cp));
    out->append(buf);
  } else if (cp >= 0x20 && cp < 0x7F) {
    if (specials.find(static_cast<char>(cp)) != absl::string_view::npos) out->push_back('\\');
    out->push_back(static_cast<char>(cp));
  } else if (cp == '\n') {
    out->append("\\n");
  } else if (cp == '\t') {
    out->append("\\t");
  } else if (cp == '\r') {
    out->append("\\r");
  } else if (cp < 0x80) {
    std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned>(cp));
    out->append(buf);
  } else {
    AppendUtf8(cp, out);
  }
}

// Decodes one UTF-8 sequence at text[*i]; an invalid byte decodes as itself.
uint32_t NextCodePoint(absl::string_view text, size_t* i) {
  const auto b0 = static_cast<unsigned char>(text[*i]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 0x6 ? 2 : (b0 >> 4) == 0xE ? 3 : (b0 >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || *i + len > text.size()) {
    ++*i;
    return b0;
  }
  uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(text[*i + k]);
    if ((b & 0xC0) != 0x80) {
      ++*i;
      return b0;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *i += len;
  return cp;
}

}  // namespace

CodePointRanges NormalizeRanges(CodePointRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodePointRanges out;
  for (const auto& r : ranges) {
    if (r.first > r.second) continue;
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

CodePointRanges SubtractRanges(const CodePointRanges& a, const CodePointRanges& b) {
  CodePointRanges out;
  for (auto r : a) {
    uint32_t lo = r.first;
    bool done = false;
    for (const auto& s : b) {
      if (s.second < lo || s.first > r.second) continue;
      if (s.first > lo) out.push_back({lo, s.first - 1});
      if (s.second >= r.second) {
        done = true;
        break;
      }
      lo = s.second + 1;
    }
    if (!done) out.push_back({lo, r.second});
  }
  return out;
}

CodePointRanges ComplementRanges(const CodePointRanges& ranges) {
  return SubtractRanges({{0, 0xD7FF}, {0xE000, kMaxCodePoint}}, ranges);
}

std::string GbnfLiteral(absl::string_view text) {
  std::string out = "\"";
  size_t i = 0;
  while (i < text.size()) AppendEscaped(NextCodePoint(text, &i), "\"\\", &out);
  out.push_back('"');
  return out;
}

std::string GbnfCodePointLiteral(uint32_t cp) {
  std::string out = "\"";
  AppendEscaped(cp, "\"\\", &out);
  out.push_back('"');
  return out;
}

std::string GbnfClass(const CodePointRanges& ranges) {
  std::string out = "[";
  constexpr absl::string_view kSpecials = "]\\^-[";
  for (const auto& r : ranges) {
    AppendEscaped(r.first, kSpecials, &out);
    if (r.second != r.first) {
      if (r.second != r.first + 1) out.push_back('-');
      AppendEscaped(r.second, kSpecials, &out);
    }
  }
  out.push_back(']');
  return out;
}

std::string JsonEncodedChar(uint32_t cp) {
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    default:
      break;
  }
  std::string out;
  if (cp < 0x20) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
    out = buf;
  } else {
    AppendUtf8(cp, &out);
  }
  return out;
}

std::string GbnfJsonCharsIn(const CodePointRanges& ranges) {
  static const CodePointRanges kEscaped = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  std::vector<std::string> alternatives;
  CodePointRanges plain = SubtractRanges(ranges, kEscaped);
  if (!plain.empty()) alternatives.push_back(GbnfClass(plain));
  for (const auto& r : ranges) {
    for (uint32_t cp = r.first; cp <= r.second && cp <= '\\'; ++cp) {
      if (cp < 0x20 || cp == '"' || cp == '\\') {
        alternatives.push_back(GbnfLiteral(JsonEncodedChar(cp)));
      }
    }
  }
  if (alternatives.size() == 1) return alternatives[0];
  std::string out = "(";
  for (size_t i = 0; i < alternatives.size(); ++i) {
    if (i > 0) out.append(" | ");
    out.append(alternatives[i]);
  }
  out.push_back(')');
  return out;
}

}  // namespace ferry::grammar
