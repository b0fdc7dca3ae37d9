#include "engine/grammar/gbnf_rewrite.h"

namespace ferry::grammar {
namespace {

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

// The index just past a quoted run opened at `i` (a literal's '"' or a class's '['), escapes
// skipped; the text's end when it is not closed.
size_t SkipQuoted(absl::string_view s, size_t i, char close) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == close) {
      return i + 1;
    }
  }
  return s.size();
}

}  // namespace

std::string PrefixGbnfRules(absl::string_view gbnf, absl::string_view prefix) {
  std::string out;
  out.reserve(gbnf.size() + gbnf.size() / 4);
  size_t i = 0;
  while (i < gbnf.size()) {
    const char c = gbnf[i];
    size_t end = i + 1;
    if (c == '"') {
      end = SkipQuoted(gbnf, i, '"');
    } else if (c == '[') {
      end = SkipQuoted(gbnf, i, ']');
    } else if (c == '#') {
      end = gbnf.find('\n', i);
      if (end == absl::string_view::npos) end = gbnf.size();
    } else if (c == '{') {
      end = gbnf.find('}', i);
      end = end == absl::string_view::npos ? gbnf.size() : end + 1;
    } else if (NameChar(c)) {
      end = i;
      while (end < gbnf.size() && NameChar(gbnf[end])) ++end;
      out.append(prefix.data(), prefix.size());
    }
    out.append(gbnf.data() + i, end - i);
    i = end;
  }
  return out;
}

}  // namespace ferry::grammar
