#include "engine/grammar/gbnf_text.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
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

// The code points of `text` (NextCodePoint's decoding).
std::vector<uint32_t> CodePoints(absl::string_view text) {
  std::vector<uint32_t> out;
  size_t i = 0;
  while (i < text.size()) out.push_back(NextCodePoint(text, &i));
  return out;
}

// The rules of GbnfTextUntilRules (`until`) and GbnfTextWithoutRules: one rule per state of the
// marker's KMP automaton (state j: the last j code points read are the marker's first j, and no
// earlier occurrence), each alternative one character class and the next state's rule.
std::string MarkerRules(absl::string_view name, absl::string_view marker, bool until) {
  const std::vector<uint32_t> m = CodePoints(marker);
  const size_t k = m.size();
  if (k == 0) return absl::StrCat(name, " ::= \"\"\n");  // (a precondition: never asked)
  // fail[j]: the longest proper border of m[0..j].
  std::vector<size_t> fail(k, 0);
  for (size_t j = 1, b = 0; j < k; ++j) {
    while (b > 0 && m[j] != m[b]) b = fail[b - 1];
    if (m[j] == m[b]) ++b;
    fail[j] = b;
  }
  auto next = [&](size_t j, uint32_t c) {
    while (j > 0 && (j == k || m[j] != c)) j = fail[j - 1];
    return m[j] == c ? j + 1 : 0;
  };
  std::vector<uint32_t> alphabet = m;
  std::sort(alphabet.begin(), alphabet.end());
  alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
  auto state = [&](size_t j) { return j == 0 ? std::string(name) : absl::StrCat(name, "-", j); };
  std::string out;
  for (size_t j = 0; j < k; ++j) {
    // The characters that lead from state j to each state but 0 (all others lead to 0).
    std::map<size_t, CodePointRanges> to;
    CodePointRanges leave_zero;
    for (uint32_t c : alphabet) {
      const size_t t = next(j, c);
      if (t == 0) continue;
      to[t].push_back({c, c});
      leave_zero.push_back({c, c});
    }
    std::vector<std::string> alternatives;
    // "Any other character": the negated class, which reads as the complement (surrogates
    // aside, which UTF-8 cannot carry) and stays short.
    alternatives.push_back(
        absl::StrCat("[^", GbnfClass(NormalizeRanges(leave_zero)).substr(1), " ", state(0)));
    for (const auto& [t, chars] : to) {
      const std::string set = chars.size() == 1 ? GbnfCodePointLiteral(chars[0].first)
                                                : GbnfClass(NormalizeRanges(chars));
      if (t < k) {
        alternatives.push_back(absl::StrCat(set, " ", state(t)));
      } else if (until) {
        alternatives.push_back(set);  // the marker's last character: the text ends
      }
    }
    if (!until) alternatives.push_back("\"\"");
    absl::StrAppend(&out, state(j), " ::= ");
    for (size_t a = 0; a < alternatives.size(); ++a) {
      absl::StrAppend(&out, a > 0 ? " | " : "", alternatives[a]);
    }
    out.push_back('\n');
  }
  return out;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// `gbnf` with every rule name (a run of name characters outside literals, classes, repetition
// counts and comments) replaced by `map` of it; everything else copied as it is.
std::string MapGbnfNames(absl::string_view gbnf,
                         const std::function<std::string(absl::string_view)>& map) {
  std::string out;
  out.reserve(gbnf.size() + gbnf.size() / 4);
  size_t i = 0;
  // Copies up to and including the first unescaped `close` (or to the end).
  auto copy_quoted = [&](char close) {
    out.push_back(gbnf[i++]);
    while (i < gbnf.size()) {
      const char c = gbnf[i++];
      out.push_back(c);
      if (c == '\\' && i < gbnf.size()) {
        out.push_back(gbnf[i++]);
      } else if (c == close) {
        return;
      }
    }
  };
  while (i < gbnf.size()) {
    const char c = gbnf[i];
    if (c == '"') {
      copy_quoted('"');
    } else if (c == '[') {
      copy_quoted(']');
    } else if (c == '{') {
      copy_quoted('}');
    } else if (c == '#') {
      const size_t end = std::min(gbnf.find('\n', i), gbnf.size());
      out.append(gbnf.data() + i, end - i);
      i = end;
    } else if (IsNameChar(c)) {
      size_t end = i;
      while (end < gbnf.size() && IsNameChar(gbnf[end])) ++end;
      out += map(gbnf.substr(i, end - i));
      i = end;
    } else {
      out.push_back(c);
      ++i;
    }
  }
  return out;
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

std::string GbnfTextUntilRules(absl::string_view name, absl::string_view marker) {
  return MarkerRules(name, marker, /*until=*/true);
}

std::string GbnfTextWithoutRules(absl::string_view name, absl::string_view marker) {
  return MarkerRules(name, marker, /*until=*/false);
}

std::string RenameGbnfRule(absl::string_view gbnf, absl::string_view from, absl::string_view to) {
  return MapGbnfNames(gbnf, [&](absl::string_view n) { return std::string(n == from ? to : n); });
}

std::string PrefixGbnfRules(absl::string_view gbnf, absl::string_view prefix) {
  return MapGbnfNames(gbnf, [&](absl::string_view n) { return absl::StrCat(prefix, n); });
}

}  // namespace ferry::grammar
