#include "engine/grammar/gbnf_parser.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/grammar/utf8_ranges.h"
#include "engine/tokenizer/utf8.h"

namespace ferry::grammar {
namespace {

using Sequence = std::vector<Element>;

struct RuleBuild {
  std::string name;
  bool generated = false;
  bool defined = false;
  size_t first_ref = 0;  // byte offset of the first reference, for "undefined rule" errors
  std::vector<Sequence> alts;
};

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class Parser {
 public:
  Parser(absl::string_view text, const GbnfLimits& limits) : text_(text), limits_(limits) {}

  absl::StatusOr<Grammar> Parse() {
    if (text_.size() > limits_.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("grammar text is ", text_.size(),
                                                     " bytes, more than the limit of ",
                                                     limits_.max_text_bytes));
    }
    line_starts_.push_back(0);
    for (size_t i = 0; i < text_.size(); ++i) {
      if (text_[i] == '\n') line_starts_.push_back(i + 1);
    }
    SkipSpace(true);
    while (pos_ < text_.size()) {
      RETURN_IF_ERROR(ParseRule());
    }
    for (const RuleBuild& rule : rules_) {
      if (!rule.defined) return ErrorAt(rule.first_ref, "undefined rule '" + rule.name + "'");
    }
    auto root = names_.find("root");
    if (root == names_.end()) {
      return absl::InvalidArgumentError("the grammar has no 'root' rule (the start rule)");
    }
    return Finish(root->second);
  }

 private:
  std::string Where(size_t at) const {
    // line_starts_ is sorted; the line holding `at` is the last start <= at.
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    size_t line = static_cast<size_t>(it - line_starts_.begin());
    return absl::StrCat("line ", line, ", column ", at - line_starts_[line - 1] + 1);
  }
  absl::Status ErrorAt(size_t at, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(Where(at), ": ", what));
  }
  absl::Status Error(absl::string_view what) const { return ErrorAt(pos_, what); }

  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }
  bool AtEnd() const { return pos_ >= text_.size(); }

  void SkipSpace(bool newline_ok) {
    while (!AtEnd()) {
      char c = Peek();
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++pos_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  absl::StatusOr<absl::string_view> ParseName() {
    size_t start = pos_;
    while (!AtEnd() && IsWordChar(Peek())) ++pos_;
    if (pos_ == start) return Error("expected a rule name");
    return text_.substr(start, pos_ - start);
  }

  absl::StatusOr<uint32_t> RuleId(absl::string_view name, size_t at) {
    auto it = names_.find(name);
    if (it != names_.end()) return it->second;
    RETURN_IF_ERROR(CheckRuleCount());
    uint32_t id = static_cast<uint32_t>(rules_.size());
    RuleBuild rule;
    rule.name = std::string(name);
    rule.first_ref = at;
    rules_.push_back(std::move(rule));
    names_.emplace(std::string(name), id);
    return id;
  }

  absl::Status CheckRuleCount() {
    if (rules_.size() >= limits_.max_rules) {
      return Error(absl::StrCat("more than ", limits_.max_rules,
                                " rules (counting groups and repetitions)"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> NewRule(absl::string_view what, std::vector<Sequence> alts) {
    RETURN_IF_ERROR(CheckRuleCount());
    RETURN_IF_ERROR(CountElements(alts));
    RuleBuild rule;
    rule.name = absl::StrCat(rules_[current_rule_].name, "'s ", what, " ending at ", Where(pos_));
    rule.generated = true;
    rule.defined = true;
    rule.alts = std::move(alts);
    rules_.push_back(std::move(rule));
    return static_cast<uint32_t>(rules_.size() - 1);
  }

  absl::Status CountElements(const std::vector<Sequence>& alts) {
    for (const Sequence& s : alts) elements_ += s.size() + 1;
    if (elements_ > limits_.max_elements) {
      return Error(absl::StrCat("the grammar needs more than ", limits_.max_elements,
                                " elements (after expanding repetitions)"));
    }
    return absl::OkStatus();
  }

  uint32_t ByteSetId(const ByteSet& set) {
    std::string key(reinterpret_cast<const char*>(set.bits.data()), sizeof(set.bits));
    auto [it, inserted] = byte_set_ids_.emplace(key, static_cast<uint32_t>(byte_sets_.size()));
    if (inserted) byte_sets_.push_back(set);
    return it->second;
  }

  absl::Status ParseRule() {
    size_t name_at = pos_;
    ASSIGN_OR_RETURN(absl::string_view name, ParseName());
    SkipSpace(false);
    if (text_.substr(pos_, 3) != "::=") return Error("expected '::=' after the rule name");
    pos_ += 3;
    SkipSpace(true);
    ASSIGN_OR_RETURN(uint32_t id, RuleId(name, name_at));
    if (rules_[id].defined)
      return ErrorAt(name_at, "rule '" + std::string(name) + "' is defined twice");
    rules_[id].defined = true;
    current_rule_ = id;
    ASSIGN_OR_RETURN(std::vector<Sequence> alts, ParseAlternates(false, 0));
    RETURN_IF_ERROR(CountElements(alts));
    rules_[id].alts = std::move(alts);
    if (Peek() == '\r') ++pos_;
    if (Peek() == '\n') {
      ++pos_;
    } else if (!AtEnd()) {
      return Error(absl::StrCat("unexpected '", std::string(1, Peek()),
                                "' (expected an element, '|', or the end of the rule)"));
    }
    SkipSpace(true);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Sequence>> ParseAlternates(bool nested, size_t depth) {
    std::vector<Sequence> alts;
    while (true) {
      Sequence seq;
      RETURN_IF_ERROR(ParseSequence(nested, depth, &seq));
      alts.push_back(std::move(seq));
      if (Peek() != '|') break;
      ++pos_;
      SkipSpace(true);
    }
    return alts;
  }

  // One code point of a literal or class, with escapes; `pos_` at it.
  absl::StatusOr<uint32_t> ParseChar() {
    if (Peek() == '\\') {
      size_t at = pos_;
      ++pos_;
      if (AtEnd()) return ErrorAt(at, "the grammar ends inside an escape");
      char c = Peek();
      ++pos_;
      switch (c) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case '\\':
          return uint32_t{'\\'};
        case '"':
          return uint32_t{'"'};
        case '[':
          return uint32_t{'['};
        case ']':
          return uint32_t{']'};
        case 'x':
          return ParseHex(at, 2);
        case 'u':
          return ParseHex(at, 4);
        case 'U':
          return ParseHex(at, 8);
        default:
          return ErrorAt(at, absl::StrCat("unknown escape '\\", std::string(1, c),
                                          "' (known: \\n \\r \\t \\\\ \\\" \\[ \\] \\x \\u \\U)"));
      }
    }
    // A UTF-8 encoded code point.
    size_t at = pos_;
    uint8_t b0 = static_cast<uint8_t>(Peek());
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (len == 0 || pos_ + len > text_.size()) return ErrorAt(at, "invalid UTF-8 in the grammar");
    uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < len; ++i) {
      uint8_t b = static_cast<uint8_t>(text_[pos_ + i]);
      if ((b & 0xC0) != 0x80) return ErrorAt(at, "invalid UTF-8 in the grammar");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      return ErrorAt(at, "invalid UTF-8 in the grammar");
    }
    pos_ += len;
    return cp;
  }

  absl::StatusOr<uint32_t> ParseHex(size_t at, int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      char c = Peek();
      int d = (c >= '0' && c <= '9')   ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) return ErrorAt(at, absl::StrCat("escape needs ", digits, " hex digits"));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
      return ErrorAt(at, "escape is not a Unicode scalar value (surrogate or above U+10FFFF)");
    }
    return v;
  }

  // Elements matching one code point of the (merged, sorted) ranges.
  absl::StatusOr<Sequence> ClassElements(std::vector<std::pair<uint32_t, uint32_t>> ranges,
                                         bool negated, size_t at) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (auto r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, r.second);
      } else {
        merged.push_back(r);
      }
    }
    if (negated) {
      std::vector<std::pair<uint32_t, uint32_t>> comp;
      uint32_t next = 0;
      for (auto r : merged) {
        if (r.first > next) comp.push_back({next, r.first - 1});
        next = r.second + 1;
      }
      if (next <= kMaxCodePoint) comp.push_back({next, kMaxCodePoint});
      merged = std::move(comp);
    }
    // Byte-range sequences, grouped: one set for single bytes; multi-byte ones merged when
    // all but the first byte agree.
    ByteSet single;
    std::vector<std::vector<ByteSet>> multi;
    for (auto r : merged) {
      for (const Utf8Sequence& seq : Utf8Sequences(r.first, r.second)) {
        if (seq.size() == 1) {
          single.AddRange(seq[0].lo, seq[0].hi);
          continue;
        }
        std::vector<ByteSet> sets(seq.size());
        for (size_t i = 0; i < seq.size(); ++i) sets[i].AddRange(seq[i].lo, seq[i].hi);
        bool joined = false;
        for (auto& m : multi) {
          if (m.size() == sets.size() && std::equal(m.begin() + 1, m.end(), sets.begin() + 1)) {
            m[0].Union(sets[0]);
            joined = true;
            break;
          }
        }
        if (!joined) multi.push_back(std::move(sets));
      }
    }
    std::vector<Sequence> alts;
    if (!single.Empty()) alts.push_back({Element{Element::kBytes, ByteSetId(single)}});
    for (const auto& m : multi) {
      Sequence seq;
      for (const ByteSet& s : m) seq.push_back(Element{Element::kBytes, ByteSetId(s)});
      alts.push_back(std::move(seq));
    }
    if (alts.empty()) return ErrorAt(at, "the character class matches no character");
    if (alts.size() == 1) return alts[0];
    ASSIGN_OR_RETURN(uint32_t rule, NewRule("class", std::move(alts)));
    return Sequence{Element{Element::kRule, rule}};
  }

  absl::Status ParseSequence(bool nested, size_t depth, Sequence* out) {
    size_t last_start = out->size();  // where the last item's elements begin
    bool have_last = false;
    while (!AtEnd()) {
      char c = Peek();
      size_t at = pos_;
      if (c == '"') {
        ++pos_;
        last_start = out->size();
        have_last = true;
        while (Peek() != '"') {
          if (AtEnd() || Peek() == '\n' || Peek() == '\r') {
            return ErrorAt(at, "unterminated literal (missing '\"')");
          }
          ASSIGN_OR_RETURN(uint32_t cp, ParseChar());
          std::string bytes;
          AppendUtf8(cp, &bytes);
          for (char b : bytes) {
            ByteSet set;
            set.Add(static_cast<uint8_t>(b));
            out->push_back(Element{Element::kBytes, ByteSetId(set)});
          }
        }
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        bool negated = false;
        if (Peek() == '^') {
          negated = true;
          ++pos_;
        }
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (Peek() != ']') {
          if (AtEnd()) return ErrorAt(at, "unterminated character class (missing ']')");
          ASSIGN_OR_RETURN(uint32_t lo, ParseChar());
          uint32_t hi = lo;
          if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < text_.size()) {
            size_t range_at = pos_;
            ++pos_;
            ASSIGN_OR_RETURN(hi, ParseChar());
            if (hi < lo) return ErrorAt(range_at, "character range is reversed (end < start)");
          }
          ranges.push_back({lo, hi});
        }
        ++pos_;
        ASSIGN_OR_RETURN(Sequence elems, ClassElements(std::move(ranges), negated, at));
        last_start = out->size();
        have_last = true;
        out->insert(out->end(), elems.begin(), elems.end());
      } else if (c == '.') {
        ++pos_;
        ASSIGN_OR_RETURN(Sequence elems, ClassElements({}, true, at));
        last_start = out->size();
        have_last = true;
        out->insert(out->end(), elems.begin(), elems.end());
      } else if (IsWordChar(c)) {
        ASSIGN_OR_RETURN(absl::string_view name, ParseName());
        ASSIGN_OR_RETURN(uint32_t id, RuleId(name, at));
        last_start = out->size();
        have_last = true;
        out->push_back(Element{Element::kRule, id});
      } else if (c == '(') {
        if (depth + 1 > limits_.max_nesting_depth) {
          return Error(absl::StrCat("groups nested deeper than ", limits_.max_nesting_depth));
        }
        ++pos_;
        SkipSpace(true);
        ASSIGN_OR_RETURN(std::vector<Sequence> alts, ParseAlternates(true, depth + 1));
        if (Peek() != ')') return ErrorAt(at, "unbalanced '(': missing ')'");
        ++pos_;
        last_start = out->size();
        have_last = true;
        if (alts.size() == 1) {
          out->insert(out->end(), alts[0].begin(), alts[0].end());
        } else {
          ASSIGN_OR_RETURN(uint32_t rule, NewRule("group", std::move(alts)));
          out->push_back(Element{Element::kRule, rule});
        }
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) {
          return Error(absl::StrCat("'", std::string(1, c), "' has no item before it to repeat"));
        }
        size_t min = 0, max = kUnbounded;
        ++pos_;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') RETURN_IF_ERROR(ParseBraces(at, &min, &max));
        Sequence item(out->begin() + static_cast<std::ptrdiff_t>(last_start), out->end());
        out->resize(last_start);
        RETURN_IF_ERROR(Repeat(std::move(item), min, max, out));
      } else if (c == ')' || c == '|') {
        break;
      } else if (c == '\n' || c == '\r') {
        break;
      } else if (c == '<' || (c == '!' && Peek(1) == '<')) {
        return Error("token references (<...>) are not supported");
      } else {
        break;
      }
      SkipSpace(nested);
    }
    return absl::OkStatus();
  }

  absl::Status ParseBraces(size_t at, size_t* min, size_t* max) {
    auto number = [&](size_t* v) -> absl::StatusOr<bool> {
      size_t start = pos_;
      uint64_t n = 0;
      while (Peek() >= '0' && Peek() <= '9') {
        n = n * 10 + static_cast<uint64_t>(Peek() - '0');
        if (n > limits_.max_repetition) {
          return ErrorAt(
              at, absl::StrCat("repetition bound above the limit of ", limits_.max_repetition));
        }
        ++pos_;
      }
      *v = static_cast<size_t>(n);
      return pos_ > start;
    };
    SkipSpace(false);
    ASSIGN_OR_RETURN(bool has_min, number(min));
    if (!has_min) return ErrorAt(at, "expected a number after '{'");
    SkipSpace(false);
    if (Peek() == ',') {
      ++pos_;
      SkipSpace(false);
      ASSIGN_OR_RETURN(bool has_max, number(max));
      if (!has_max) *max = kUnbounded;
      SkipSpace(false);
    } else {
      *max = *min;
    }
    if (Peek() != '}') return ErrorAt(at, "expected '}' to close the repetition");
    ++pos_;
    if (*max != kUnbounded && *max < *min) {
      return ErrorAt(at, "repetition {m,n} with n < m");
    }
    return absl::OkStatus();
  }

  // Appends `item` repeated [min, max] times.
  absl::Status Repeat(Sequence item, size_t min, size_t max, Sequence* out) {
    if (item.empty()) return absl::OkStatus();
    if (item.size() > 1) {
      ASSIGN_OR_RETURN(uint32_t rule, NewRule("item", {item}));
      item = {Element{Element::kRule, rule}};
    }
    elements_ += min;
    if (elements_ > limits_.max_elements) {
      return Error(absl::StrCat("the grammar needs more than ", limits_.max_elements,
                                " elements (after expanding repetitions)"));
    }
    for (size_t i = 0; i < min; ++i) out->push_back(item[0]);
    if (max == kUnbounded) {
      // star ::= item star | ""
      RETURN_IF_ERROR(CheckRuleCount());
      uint32_t star = static_cast<uint32_t>(rules_.size());
      ASSIGN_OR_RETURN(uint32_t id,
                       NewRule("star", {{item[0], Element{Element::kRule, star}}, {}}));
      (void)id;
      out->push_back(Element{Element::kRule, star});
      return absl::OkStatus();
    }
    // opt_k ::= item opt_{k-1} | "" ; opt_1 ::= item | "".
    uint32_t prev = 0;
    bool have_prev = false;
    for (size_t k = 1; k <= max - min; ++k) {
      Sequence first = {item[0]};
      if (have_prev) first.push_back(Element{Element::kRule, prev});
      ASSIGN_OR_RETURN(prev, NewRule("opt", {first, {}}));
      have_prev = true;
    }
    if (have_prev) out->push_back(Element{Element::kRule, prev});
    return absl::OkStatus();
  }

  absl::StatusOr<Grammar> Finish(uint32_t root) {
    Grammar g;
    g.root = root;
    g.byte_sets = std::move(byte_sets_);
    g.rules.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      g.rules[r].name = std::move(rules_[r].name);
      g.rules[r].generated = rules_[r].generated;
      for (const Sequence& seq : rules_[r].alts) {
        g.rules[r].alternatives.push_back(static_cast<uint32_t>(g.elements.size()));
        g.elements.insert(g.elements.end(), seq.begin(), seq.end());
        g.elements.push_back(Element{Element::kEnd, 0});
      }
    }
    RETURN_IF_ERROR(g.Validate());
    return g;
  }

  static constexpr size_t kUnbounded = ~size_t{0};
  absl::string_view text_;
  const GbnfLimits& limits_;
  size_t pos_ = 0;
  std::vector<size_t> line_starts_;
  size_t elements_ = 0;
  uint32_t current_rule_ = 0;
  std::vector<RuleBuild> rules_;
  absl::flat_hash_map<std::string, uint32_t> names_;
  std::vector<ByteSet> byte_sets_;
  absl::flat_hash_map<std::string, uint32_t> byte_set_ids_;
};

}  // namespace

absl::StatusOr<Grammar> ParseGbnf(absl::string_view text, const GbnfLimits& limits) {
  return Parser(text, limits).Parse();
}

}  // namespace ferry::grammar
