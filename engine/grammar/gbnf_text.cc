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

// The rules of GbnfTextUntilRules and GbnfTextWithoutRules, for text that contains none of
// `markers`, or (`until` >= 0) that ends at the first occurrence of markers[until] and contains
// no marker before. One rule per state of the markers' automaton over code points (Aho-Corasick;
// for one marker, KMP's): a state is the longest suffix of the text read that begins a marker,
// each alternative one character class and the next state's rule. Where a marker ends, the
// longest one ending there (the one that began first, which a parser's search finds) decides:
// markers[until] ends the text, any other is refused.
std::string MarkerRules(absl::string_view name, const std::vector<std::string>& markers,
                        int until) {
  // The trie of the markers: node 0 is the empty prefix.
  struct Node {
    std::map<uint32_t, size_t> child;
    size_t depth = 0;
    size_t fail = 0;
    int ends = -1;  // the longest marker that is a suffix of this node's text
  };
  std::vector<Node> nodes(1);
  std::vector<uint32_t> alphabet;
  for (size_t i = 0; i < markers.size(); ++i) {
    size_t at = 0;
    for (uint32_t c : CodePoints(markers[i])) {
      alphabet.push_back(c);
      auto it = nodes[at].child.find(c);
      if (it == nodes[at].child.end()) {
        nodes.push_back({});
        nodes.back().depth = nodes[at].depth + 1;
        it = nodes[at].child.emplace(c, nodes.size() - 1).first;
      }
      at = it->second;
    }
    if (at != 0 && nodes[at].ends < 0) nodes[at].ends = static_cast<int>(i);
  }
  std::sort(alphabet.begin(), alphabet.end());
  alphabet.erase(std::unique(alphabet.begin(), alphabet.end()), alphabet.end());
  // Breadth first: failure links, the longest marker ending at each node, and the transition
  // function over the alphabet (any other character leads to node 0).
  std::vector<std::map<uint32_t, size_t>> next(nodes.size());
  std::vector<size_t> order = {0};
  // Nodes below a marker's end: never reached, as the text ends or is refused there first.
  std::vector<bool> beyond(nodes.size(), false);
  for (size_t q = 0; q < order.size(); ++q) {
    const size_t v = order[q];
    if (v != 0 && nodes[v].ends < 0) nodes[v].ends = nodes[nodes[v].fail].ends;
    for (uint32_t c : alphabet) {
      auto it = nodes[v].child.find(c);
      if (it != nodes[v].child.end()) {
        const size_t u = it->second;
        nodes[u].fail = v == 0 ? 0 : next[nodes[v].fail][c];
        beyond[u] = beyond[v] || nodes[v].ends >= 0;
        next[v][c] = u;
        order.push_back(u);
      } else {
        next[v][c] = v == 0 ? 0 : next[nodes[v].fail][c];
      }
    }
  }
  auto state = [&](size_t v) { return v == 0 ? std::string(name) : absl::StrCat(name, "-", v); };
  std::string out;
  for (size_t v : order) {
    if (nodes[v].ends >= 0 || beyond[v]) continue;  // not a state the text can be in
    // The characters that lead from v to each node but 0 (all others lead to 0).
    std::map<size_t, CodePointRanges> to;
    CodePointRanges leave_zero;
    for (uint32_t c : alphabet) {
      const size_t t = next[v][c];
      if (t == 0) continue;
      to[t].push_back({c, c});
      leave_zero.push_back({c, c});
    }
    std::vector<std::string> alternatives;
    // "Any other character": the negated class, which reads as the complement (surrogates
    // aside, which UTF-8 cannot carry) and stays short.
    alternatives.push_back(
        leave_zero.empty()
            ? absl::StrCat(GbnfClass(ComplementRanges({})), " ", state(0))
            : absl::StrCat("[^", GbnfClass(NormalizeRanges(leave_zero)).substr(1), " ", state(0)));
    for (const auto& [t, chars] : to) {
      const std::string set = chars.size() == 1 ? GbnfCodePointLiteral(chars[0].first)
                                                : GbnfClass(NormalizeRanges(chars));
      if (nodes[t].ends < 0) {
        alternatives.push_back(absl::StrCat(set, " ", state(t)));
      } else if (nodes[t].ends == until) {
        alternatives.push_back(set);  // the marker's last character: the text ends
      }
    }
    if (until < 0) alternatives.push_back("\"\"");
    absl::StrAppend(&out, state(v), " ::= ");
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
  return MarkerRules(name, {std::string(marker)}, /*until=*/0);
}

std::string GbnfTextUntilRules(absl::string_view name, absl::string_view marker,
                               const std::vector<std::string>& others) {
  std::vector<std::string> markers = {std::string(marker)};
  markers.insert(markers.end(), others.begin(), others.end());
  return MarkerRules(name, markers, /*until=*/0);
}

std::string GbnfTextWithoutRules(absl::string_view name, absl::string_view marker) {
  return MarkerRules(name, {std::string(marker)}, /*until=*/-1);
}

std::string GbnfTextWithoutAnyRules(absl::string_view name,
                                    const std::vector<std::string>& markers) {
  return MarkerRules(name, markers, /*until=*/-1);
}

std::string RenameGbnfRule(absl::string_view gbnf, absl::string_view from, absl::string_view to) {
  return MapGbnfNames(gbnf, [&](absl::string_view n) { return std::string(n == from ? to : n); });
}

std::string PrefixGbnfRules(absl::string_view gbnf, absl::string_view prefix) {
  return MapGbnfNames(gbnf, [&](absl::string_view n) { return absl::StrCat(prefix, n); });
}

}  // namespace ferry::grammar
