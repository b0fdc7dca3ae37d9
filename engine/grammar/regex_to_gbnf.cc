#include "engine/grammar/regex_to_gbnf.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/status.h"
#include "engine/grammar/gbnf_text.h"

namespace ferry::grammar {
namespace {

const CodePointRanges& Digits() {
  static const CodePointRanges r = {{'0', '9'}};
  return r;
}
const CodePointRanges& WordChars() {
  static const CodePointRanges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const CodePointRanges& SpaceChars() {
  static const CodePointRanges r = {{'\t', '\r'}, {' ', ' '}};
  return r;
}

// One parsed alternative of the top level, with its anchors.
struct Branch {
  bool anchored_start = false;
  bool anchored_end = false;
  std::string expression;
};

// A parsed piece: its GBNF text and its expanded size (for the limit).
struct Piece {
  std::string text;
  long long size = 0;
};

class RegexParser {
 public:
  RegexParser(absl::string_view pattern, RegexTarget target, const RegexLimits& limits)
      : pattern_(pattern), target_(target), limits_(limits) {}

  absl::StatusOr<std::vector<Branch>> ParseTop() {
    if (static_cast<long long>(pattern_.size()) > limits_.max_pattern_bytes) {
      return Error(absl::StrCat("is ", pattern_.size(), " bytes, over the limit of ",
                                limits_.max_pattern_bytes));
    }
    RETURN_IF_ERROR(Decode());
    std::vector<Branch> branches;
    long long total = 0;
    while (true) {
      Branch branch;
      if (Peek() == '^') {
        branch.anchored_start = true;
        ++pos_;
      }
      ASSIGN_OR_RETURN(Piece seq, ParseSequence(/*depth=*/0, /*top=*/true));
      if (Peek() == '$') {
        branch.anchored_end = true;
        ++pos_;
      }
      total += seq.size;
      branch.expression = std::move(seq.text);
      branches.push_back(std::move(branch));
      if (AtEnd()) break;
      if (Peek() == '|') {
        ++pos_;
        continue;
      }
      if (Peek() == ')') return Error("has an unbalanced ')'");
      return Error("has an anchor ('^' or '$') that is not at the start or end of an alternative");
    }
    if (total > limits_.max_expanded_size) return TooLarge();
    return branches;
  }

 private:
  absl::Status Decode() {
    size_t i = 0;
    while (i < pattern_.size()) {
      const auto b0 = static_cast<unsigned char>(pattern_[i]);
      int len = b0 < 0x80           ? 1
                : (b0 >> 5) == 0x6  ? 2
                : (b0 >> 4) == 0xE  ? 3
                : (b0 >> 3) == 0x1E ? 4
                                    : 0;
      if (len == 0 || i + len > pattern_.size()) return Error("is not valid UTF-8");
      uint32_t cp = len == 1 ? b0 : b0 & (0x7F >> len);
      for (int k = 1; k < len; ++k) {
        const auto b = static_cast<unsigned char>(pattern_[i + k]);
        if ((b & 0xC0) != 0x80) return Error("is not valid UTF-8");
        cp = (cp << 6) | (b & 0x3F);
      }
      cps_.push_back(cp);
      i += len;
    }
    return absl::OkStatus();
  }

  bool AtEnd() const { return pos_ >= cps_.size(); }
  uint32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFF;
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regex \"", pattern_, "\" ", what, " (at character ", pos_, ")"));
  }
  absl::Status TooLarge() const {
    return Error(absl::StrCat("expands beyond the limit of ", limits_.max_expanded_size,
                              " characters (nested counted repetitions)"));
  }

  std::string Chars(const CodePointRanges& ranges) const {
    return target_ == RegexTarget::kJsonStringContent ? GbnfJsonCharsIn(ranges) : GbnfClass(ranges);
  }
  std::string Char(uint32_t cp) const {
    return target_ == RegexTarget::kJsonStringContent ? GbnfLiteral(JsonEncodedChar(cp))
                                                      : GbnfCodePointLiteral(cp);
  }

  // A sequence of quantified atoms up to '|', ')' or the end (or a '$' ending a top-level
  // alternative).
  absl::StatusOr<Piece> ParseSequence(int depth, bool top) {
    std::vector<std::string> items;
    long long size = 0;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        if (top && (pos_ + 1 == cps_.size() || Peek(1) == '|')) break;
        return Error("has '$' that is not at the end of a top-level alternative");
      }
      if (Peek() == '^')
        return Error("has '^' that is not at the start of a top-level alternative");
      ASSIGN_OR_RETURN(Piece atom, ParseAtom(depth));
      ASSIGN_OR_RETURN(atom, ParseQuantifier(std::move(atom)));
      size += atom.size;
      if (size > limits_.max_expanded_size) return TooLarge();
      items.push_back(std::move(atom.text));
    }
    if (items.empty()) return Piece{"\"\"", 0};
    return Piece{absl::StrJoin(items, " "), size};
  }

  absl::StatusOr<Piece> ParseAlternation(int depth) {
    std::vector<std::string> alternatives;
    long long size = 0;
    while (true) {
      ASSIGN_OR_RETURN(Piece seq, ParseSequence(depth, /*top=*/false));
      size = std::max(size, seq.size);
      alternatives.push_back(std::move(seq.text));
      if (Peek() != '|') break;
      ++pos_;
    }
    return Piece{absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")"), size};
  }

  absl::StatusOr<Piece> ParseAtom(int depth) {
    const uint32_t c = Peek();
    ++pos_;
    switch (c) {
      case '(':
        return ParseGroup(depth + 1);
      case '[': {
        ASSIGN_OR_RETURN(CodePointRanges ranges, ParseClass());
        return Piece{Chars(ranges), 1};
      }
      case '.':
        return Piece{Chars(ComplementRanges({{'\n', '\n'}})), 1};
      case '\\':
        return ParseEscape();
      case '*':
      case '+':
      case '?':
        --pos_;
        return Error("has a quantifier with nothing to repeat");
      case '{':
        if (LooksLikeQuantifier()) {
          --pos_;
          return Error("has a quantifier with nothing to repeat");
        }
        return Piece{Char(c), 1};
      default:
        return Piece{Char(c), 1};
    }
  }

  absl::StatusOr<Piece> ParseGroup(int depth) {
    if (depth > limits_.max_depth) {
      return Error(absl::StrCat("nests groups deeper than ", limits_.max_depth));
    }
    if (Peek() == '?') {
      const uint32_t k = Peek(1);
      if (k == ':') {
        pos_ += 2;
      } else if (k == 'P' && Peek(2) == '<') {
        pos_ += 3;
        RETURN_IF_ERROR(SkipGroupName());
      } else if (k == '<' && Peek(2) != '=' && Peek(2) != '!') {
        pos_ += 2;
        RETURN_IF_ERROR(SkipGroupName());
      } else if (k == '=' || k == '!' || k == '<') {
        return Error("uses lookaround, which is not supported");
      } else if (k == 'P' && Peek(2) == '=') {
        return Error("uses a backreference, which is not supported");
      } else {
        return Error(
            "uses a group extension (inline flags, conditionals, comments, atomic "
            "groups) that is not supported");
      }
    }
    ASSIGN_OR_RETURN(Piece inner, ParseAlternation(depth));
    if (Peek() != ')') return Error("has an unclosed '('");
    ++pos_;
    return inner;
  }

  absl::Status SkipGroupName() {
    while (!AtEnd() && Peek() != '>') {
      const uint32_t c = Peek();
      if (!(c == '_' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
            (c >= 'A' && c <= 'Z'))) {
        return Error("has a bad group name");
      }
      ++pos_;
    }
    if (AtEnd()) return Error("has an unterminated group name");
    ++pos_;
    return absl::OkStatus();
  }

  // At the character after '{': digits? (',' digits?)? '}' with at least one digit.
  bool LooksLikeQuantifier() const { return LooksLikeQuantifierAt(pos_); }
  bool LooksLikeQuantifierAt(size_t i) const {
    bool digit = false;
    while (i < cps_.size() && cps_[i] >= '0' && cps_[i] <= '9') ++i, digit = true;
    if (i < cps_.size() && cps_[i] == ',') {
      ++i;
      while (i < cps_.size() && cps_[i] >= '0' && cps_[i] <= '9') ++i, digit = true;
    }
    return digit && i < cps_.size() && cps_[i] == '}';
  }

  absl::StatusOr<long long> ReadNumber() {
    long long n = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      n = n * 10 + (Peek() - '0');
      if (n > limits_.max_repeat) {
        return Error(absl::StrCat("has a repetition bound over the limit of ", limits_.max_repeat));
      }
      ++pos_;
    }
    return n;
  }

  absl::StatusOr<Piece> ParseQuantifier(Piece atom) {
    long long min = 1, max = 1;  // max -1: unbounded
    const uint32_t c = Peek();
    if (c == '*') {
      min = 0, max = -1;
    } else if (c == '+') {
      min = 1, max = -1;
    } else if (c == '?') {
      min = 0, max = 1;
    } else if (c == '{') {
      ++pos_;
      if (!LooksLikeQuantifier()) {
        --pos_;
        return atom;
      }
      const bool has_min = Peek() >= '0' && Peek() <= '9';
      ASSIGN_OR_RETURN(min, ReadNumber());
      if (!has_min) min = 0;
      if (Peek() == ',') {
        ++pos_;
        if (Peek() == '}') {
          max = -1;
        } else {
          ASSIGN_OR_RETURN(max, ReadNumber());
        }
      } else {
        max = min;
      }
      if (max >= 0 && max < min) return Error("has a repetition {m,n} with n < m");
      // On the '}', consumed below like the other quantifiers.
    } else {
      return atom;
    }
    ++pos_;
    if (Peek() == '?') {
      ++pos_;  // lazy: the same language
    } else if (Peek() == '+') {
      return Error("uses a possessive quantifier, which is not supported");
    }
    if (Peek() == '*' || Peek() == '+' || Peek() == '?' ||
        (Peek() == '{' && LooksLikeQuantifierAt(pos_ + 1))) {
      return Error("has a quantifier after a quantifier");
    }
    Piece out;
    out.size = atom.size * (max < 0 ? std::max<long long>(min, 1) : std::max<long long>(max, 1));
    const std::string& a = atom.text;
    if (min == 0 && max == -1) {
      out.text = absl::StrCat("(", a, ")*");
    } else if (min == 1 && max == -1) {
      out.text = absl::StrCat("(", a, ")+");
    } else if (min == 0 && max == 1) {
      out.text = absl::StrCat("(", a, ")?");
    } else if (max == -1) {
      out.text = absl::StrCat("(", a, "){", min, ",}");
    } else if (min == max) {
      out.text = min == 0 ? "\"\"" : absl::StrCat("(", a, "){", min, "}");
    } else {
      out.text = absl::StrCat("(", a, "){", min, ",", max, "}");
    }
    if (out.size > limits_.max_expanded_size) return TooLarge();
    return out;
  }

  absl::StatusOr<uint32_t> ReadHex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const uint32_t c = Peek();
      int d = c >= '0' && c <= '9'   ? static_cast<int>(c - '0')
              : c >= 'a' && c <= 'f' ? static_cast<int>(c - 'a' + 10)
              : c >= 'A' && c <= 'F' ? static_cast<int>(c - 'A' + 10)
                                     : -1;
      if (d < 0) return Error("has a bad hexadecimal escape");
      v = v * 16 + d;
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
      return Error("escapes a code point that is not a Unicode scalar value");
    }
    return v;
  }

  // After a backslash: a character set (class escapes) or one code point. `in_class` selects
  // the meaning of \b (backspace in a class, a word boundary outside).
  absl::StatusOr<CodePointRanges> ParseEscapeSet(bool in_class) {
    if (AtEnd()) return Error("ends with a backslash");
    const uint32_t c = Peek();
    ++pos_;
    switch (c) {
      case 'd':
        return Digits();
      case 'D':
        return ComplementRanges(Digits());
      case 'w':
        return WordChars();
      case 'W':
        return ComplementRanges(WordChars());
      case 's':
        return SpaceChars();
      case 'S':
        return ComplementRanges(SpaceChars());
      case 'n':
        return CodePointRanges{{'\n', '\n'}};
      case 't':
        return CodePointRanges{{'\t', '\t'}};
      case 'r':
        return CodePointRanges{{'\r', '\r'}};
      case 'f':
        return CodePointRanges{{'\f', '\f'}};
      case 'v':
        return CodePointRanges{{'\v', '\v'}};
      case 'a':
        return CodePointRanges{{7, 7}};
      case '0':
        if (Peek() >= '0' && Peek() <= '7') return Error("uses an octal escape, not supported");
        return CodePointRanges{{0, 0}};
      case 'x': {
        ASSIGN_OR_RETURN(uint32_t v, ReadHex(2));
        return CodePointRanges{{v, v}};
      }
      case 'u': {
        ASSIGN_OR_RETURN(uint32_t v, ReadHex(4));
        return CodePointRanges{{v, v}};
      }
      case 'U': {
        ASSIGN_OR_RETURN(uint32_t v, ReadHex(8));
        return CodePointRanges{{v, v}};
      }
      case 'b':
        if (in_class) return CodePointRanges{{8, 8}};
        --pos_;
        return Error("uses a word boundary \\b, which is not supported");
      default:
        break;
    }
    --pos_;
    if (c >= '1' && c <= '9') return Error("uses a backreference, which is not supported");
    if (c == 'k') return Error("uses a backreference, which is not supported");
    if (c == 'p' || c == 'P') return Error("uses a Unicode property, which is not supported");
    if (c == 'B' || c == 'A' || c == 'Z' || c == 'z' || c == 'G') {
      return Error("uses an assertion escape, which is not supported");
    }
    if (c < 0x80 && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
      return Error("uses an unknown escape");
    }
    ++pos_;
    return CodePointRanges{{c, c}};
  }

  absl::StatusOr<Piece> ParseEscape() {
    ASSIGN_OR_RETURN(CodePointRanges set, ParseEscapeSet(/*in_class=*/false));
    if (set.size() == 1 && set[0].first == set[0].second) return Piece{Char(set[0].first), 1};
    return Piece{Chars(set), 1};
  }

  // After '[': the class's set, negation applied; consumes the closing ']'.
  absl::StatusOr<CodePointRanges> ParseClass() {
    bool negated = false;
    if (Peek() == '^') {
      negated = true;
      ++pos_;
    }
    CodePointRanges ranges;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("has an unterminated character class");
      uint32_t c = Peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      if (c == '[' && (Peek(1) == ':' || Peek(1) == '=' || Peek(1) == '.')) {
        return Error("uses a POSIX class, which is not supported");
      }
      // One element: a code point (possibly the start of a range) or a class escape.
      uint32_t lo;
      ++pos_;
      if (c == '\\') {
        ASSIGN_OR_RETURN(CodePointRanges set, ParseEscapeSet(/*in_class=*/true));
        if (set.size() != 1 || set[0].first != set[0].second) {
          ranges.insert(ranges.end(), set.begin(), set.end());
          continue;
        }
        lo = set[0].first;
      } else {
        lo = c;
      }
      uint32_t hi = lo;
      if (Peek() == '-' && Peek(1) != ']' && Peek(1) != 0xFFFFFFFF) {
        ++pos_;
        const uint32_t d = Peek();
        ++pos_;
        if (d == '\\') {
          ASSIGN_OR_RETURN(CodePointRanges set, ParseEscapeSet(/*in_class=*/true));
          if (set.size() != 1 || set[0].first != set[0].second) {
            return Error("has a range ending in a class escape");
          }
          hi = set[0].first;
        } else {
          hi = d;
        }
        if (hi < lo) return Error("has a reversed range in a character class");
      }
      ranges.push_back({lo, hi});
    }
    ranges = NormalizeRanges(std::move(ranges));
    if (negated) ranges = ComplementRanges(ranges);
    // Surrogates cannot be matched (UTF-8 cannot carry them).
    ranges = SubtractRanges(ranges, {{0xD800, 0xDFFF}});
    if (ranges.empty()) return Error("has a character class that matches nothing");
    return ranges;
  }

  absl::string_view pattern_;
  RegexTarget target_;
  RegexLimits limits_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
};

std::string JoinBranches(const std::vector<std::string>& alternatives) {
  if (alternatives.size() == 1) return alternatives[0];
  return absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")");
}

}  // namespace

absl::StatusOr<std::string> RegexToGbnfExpression(absl::string_view pattern, RegexTarget target,
                                                  const RegexLimits& limits) {
  RegexParser parser(pattern, target, limits);
  ASSIGN_OR_RETURN(std::vector<Branch> branches, parser.ParseTop());
  std::vector<std::string> alternatives;
  for (Branch& b : branches) alternatives.push_back(std::move(b.expression));
  return JoinBranches(alternatives);
}

absl::StatusOr<std::string> PatternToGbnfJsonContent(absl::string_view pattern,
                                                     absl::string_view any_json_char,
                                                     const RegexLimits& limits) {
  RegexParser parser(pattern, RegexTarget::kJsonStringContent, limits);
  ASSIGN_OR_RETURN(std::vector<Branch> branches, parser.ParseTop());
  std::vector<std::string> alternatives;
  const std::string pad = absl::StrCat("(", any_json_char, ")*");
  for (const Branch& b : branches) {
    std::string alt;
    if (!b.anchored_start) absl::StrAppend(&alt, pad, " ");
    absl::StrAppend(&alt, b.expression);
    if (!b.anchored_end) absl::StrAppend(&alt, " ", pad);
    alternatives.push_back(std::move(alt));
  }
  return JoinBranches(alternatives);
}

absl::StatusOr<std::string> RegexToGbnf(absl::string_view pattern, const RegexLimits& limits) {
  ASSIGN_OR_RETURN(std::string expr, RegexToGbnfExpression(pattern, RegexTarget::kRawText, limits));
  return absl::StrCat("root ::= ", expr, "\n");
}

}  // namespace ferry::grammar
