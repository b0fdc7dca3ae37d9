#include "engine/template/template.h"

#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/common/status.h"
#include "engine/template/syntax_tree.h"

namespace ferry::jinja {

Template::~Template() = default;

namespace {

absl::Status SyntaxError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("template syntax error, line ", line, ": ", what));
}

// ---------------------------------------------------------------------------------------------
// Lexing the template into text and tags, with jinja2's whitespace control, trim_blocks and
// lstrip_blocks.

struct Piece {
  enum class Kind { kText, kOutput, kStatement };
  Kind kind;
  std::string content;
  int line;
};

int LineAt(absl::string_view source, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) line += source[i] == '\n';
  return line;
}

absl::StatusOr<std::vector<Piece>> SplitTemplate(absl::string_view src) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  bool strip_next = false;    // the previous tag ended with "-": strip all leading whitespace
  bool trim_newline = false;  // trim_blocks after a block or comment tag
  bool line_starting = true;  // the previous tag's match ended at a line start (jinja2's rule)
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != absl::string_view::npos &&
           (open + 1 >= src.size() ||
            (src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#'))) {
      open = open + 1 >= src.size() ? absl::string_view::npos : src.find('{', open + 1);
    }
    std::string text(
        src.substr(pos, open == absl::string_view::npos ? absl::string_view::npos : open - pos));
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && absl::ascii_isspace(static_cast<unsigned char>(text[k]))) ++k;
      line_starting = k > 0 ? text[k - 1] == '\n' : line_starting;
      text.erase(0, k);
    } else if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
      line_starting = true;
    }
    const int text_line = LineAt(src, pos);
    strip_next = trim_newline = false;
    if (open == absl::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
      break;
    }
    const char kind = src[open + 1];
    const bool minus = open + 2 < src.size() && src[open + 2] == '-';
    const bool plus = open + 2 < src.size() && src[open + 2] == '+';
    if (minus) {
      while (!text.empty() && absl::ascii_isspace(static_cast<unsigned char>(text.back()))) {
        text.pop_back();
      }
    } else if ((kind == '%' || kind == '#') && !plus) {
      // lstrip_blocks: only spaces and tabs between the line start and the tag go.
      const size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if (line_begin > 0 || line_starting) {
        bool blank = true;
        for (size_t k = line_begin; k < text.size(); ++k) {
          blank = blank && (text[k] == ' ' || text[k] == '\t');
        }
        if (blank) text.resize(line_begin);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::kText, text, text_line});
    const size_t body_start = open + 2 + ((minus || plus) ? 1 : 0);
    size_t close = absl::string_view::npos;
    if (kind == '#') {
      close = src.find("#}", body_start);
    } else {
      // The first closing delimiter outside string literals.
      const char close_char = kind == '{' ? '}' : '%';
      char quote = 0;
      for (size_t i = body_start; i + 1 < src.size(); ++i) {
        const char c = src[i];
        if (quote != 0) {
          if (c == '\\') {
            ++i;
          } else if (c == quote) {
            quote = 0;
          }
        } else if (c == '\'' || c == '"') {
          quote = c;
        } else if (c == close_char && src[i + 1] == '}') {
          close = i;
          break;
        }
      }
    }
    if (close == absl::string_view::npos) {
      return SyntaxError(LineAt(src, open), absl::StrCat("unclosed '{", std::string(1, kind), "'"));
    }
    size_t body_end = close;
    if (body_end > body_start && src[body_end - 1] == '-') {
      --body_end;
      strip_next = true;
    }
    const std::string body(src.substr(body_start, body_end - body_start));
    pos = close + 2;
    line_starting = false;
    if (kind == '#') {
      trim_newline = !strip_next;
      continue;
    }
    if (kind == '%') {
      // {% raw %} ... {% endraw %}: the content is text.
      if (absl::StripAsciiWhitespace(body) == "raw") {
        const size_t end = src.find("endraw", pos);
        const size_t tag = end == absl::string_view::npos ? end : src.rfind("{%", end);
        if (tag == absl::string_view::npos || tag < pos) {
          return SyntaxError(LineAt(src, open), "unclosed raw");
        }
        std::string raw(src.substr(pos, tag - pos));
        if (trim_newline || !strip_next) {
          if (!raw.empty() && raw[0] == '\n') raw.erase(0, 1);
        }
        pieces.push_back({Piece::Kind::kText, raw, LineAt(src, pos)});
        const size_t tag_close = src.find("%}", end);
        if (tag_close == absl::string_view::npos) {
          return SyntaxError(LineAt(src, end), "unclosed endraw");
        }
        pos = tag_close + 2;
        trim_newline = true;
        strip_next = false;
        continue;
      }
      trim_newline = !strip_next;
      pieces.push_back({Piece::Kind::kStatement, body, LineAt(src, open)});
    } else {
      pieces.push_back({Piece::Kind::kOutput, body, LineAt(src, open)});
    }
  }
  return pieces;
}

// ---------------------------------------------------------------------------------------------
// Expression tokens.

struct Tok {
  enum class Kind { kName, kInt, kFloat, kString, kOp, kEnd };
  Kind kind;
  std::string text;
  int64_t i = 0;
  double d = 0;
};

absl::StatusOr<std::vector<Tok>> Tokenize(absl::string_view s, int line) {
  std::vector<Tok> toks;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() &&
             (absl::ascii_isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) {
        ++j;
      }
      toks.push_back({Tok::Kind::kName, std::string(s.substr(i, j - i))});
      i = j;
    } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < s.size() && (absl::ascii_isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_'))
        ++j;
      bool is_float = false;
      if (j + 1 < s.size() && s[j] == '.' &&
          absl::ascii_isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
        if (k < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[k]))) {
          is_float = true;
          j = k;
          while (j < s.size() && absl::ascii_isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
      }
      std::string number(s.substr(i, j - i));
      number.erase(std::remove(number.begin(), number.end(), '_'), number.end());
      Tok t{is_float ? Tok::Kind::kFloat : Tok::Kind::kInt, number};
      if (is_float) {
        t.d = std::strtod(number.c_str(), nullptr);
      } else {
        errno = 0;
        t.i = std::strtoll(number.c_str(), nullptr, 10);
        if (errno == ERANGE) return SyntaxError(line, "integer literal out of range");
      }
      toks.push_back(t);
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string out;
      size_t j = i + 1;
      bool closed = false;
      while (j < s.size()) {
        const char d = s[j];
        if (d == c) {
          closed = true;
          ++j;
          break;
        }
        if (d == '\\' && j + 1 < s.size()) {
          const char e = s[j + 1];
          switch (e) {
            case 'n':
              out += '\n';
              break;
            case 't':
              out += '\t';
              break;
            case 'r':
              out += '\r';
              break;
            case '\\':
              out += '\\';
              break;
            case '\'':
              out += '\'';
              break;
            case '"':
              out += '"';
              break;
            default:
              out += '\\';
              out += e;
          }
          j += 2;
          continue;
        }
        out += d;
        ++j;
      }
      if (!closed) return SyntaxError(line, "unterminated string literal");
      toks.push_back({Tok::Kind::kString, out});
      i = j;
    } else {
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                   "]",  "{",  "}",  ",",  ".",  ":",  "|"};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::strlen(op);
        if (s.substr(i, n) == op) {
          toks.push_back({Tok::Kind::kOp, op});
          i += n;
          matched = true;
          break;
        }
      }
      if (!matched)
        return SyntaxError(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  toks.push_back({Tok::Kind::kEnd, ""});
  return toks;
}

// ---------------------------------------------------------------------------------------------
// Expression parser (jinja2's precedence).

class ExprParser {
 public:
  ExprParser(std::vector<Tok> toks, int line) : toks_(std::move(toks)), line_(line) {}

  bool AtEnd() const { return Peek().kind == Tok::Kind::kEnd; }
  const Tok& Peek(int ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
  bool IsOp(absl::string_view op, int ahead = 0) const {
    return Peek(ahead).kind == Tok::Kind::kOp && Peek(ahead).text == op;
  }
  bool IsName(absl::string_view name, int ahead = 0) const {
    return Peek(ahead).kind == Tok::Kind::kName && Peek(ahead).text == name;
  }
  bool Accept(absl::string_view op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool AcceptName(absl::string_view name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }
  absl::Status Expect(absl::string_view op) {
    if (Accept(op)) return absl::OkStatus();
    return SyntaxError(line_, absl::StrCat("expected '", op, "', found '", Peek().text, "'"));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().kind != Tok::Kind::kName) {
      return SyntaxError(line_, absl::StrCat("expected a name, found '", Peek().text, "'"));
    }
    return toks_[pos_++].text;
  }
  absl::Status ExpectEnd() {
    if (AtEnd()) return absl::OkStatus();
    return SyntaxError(line_, absl::StrCat("unexpected '", Peek().text, "'"));
  }

  std::unique_ptr<Expr> Make(Expr::Kind kind) {
    ++nodes_;
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }

  // Full expression, with a top-level tuple "a, b" when `allow_tuple` (for-loop iterables).
  absl::StatusOr<std::unique_ptr<Expr>> Expression() {
    if (++depth_ > kMaxDepth) return SyntaxError(line_, "expression nested too deeply");
    ASSIGN_OR_RETURN(auto e, Conditional());
    --depth_;
    return e;
  }

  absl::StatusOr<std::unique_ptr<Expr>> Conditional() {
    ASSIGN_OR_RETURN(auto value, Or());
    while (IsName("if")) {
      ++pos_;
      ASSIGN_OR_RETURN(auto cond, Or());
      auto e = Make(Expr::Kind::kCond);
      e->children.push_back(std::move(value));
      e->children.push_back(std::move(cond));
      if (AcceptName("else")) {
        ASSIGN_OR_RETURN(auto other, Conditional());
        e->children.push_back(std::move(other));
      } else {
        e->children.push_back(nullptr);
      }
      value = std::move(e);
    }
    return value;
  }

  absl::StatusOr<std::unique_ptr<Expr>> Or() {
    ASSIGN_OR_RETURN(auto left, And());
    while (AcceptName("or")) {
      ASSIGN_OR_RETURN(auto right, And());
      auto e = Make(Expr::Kind::kOr);
      e->children.push_back(std::move(left));
      e->children.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> And() {
    ASSIGN_OR_RETURN(auto left, Not());
    while (AcceptName("and")) {
      ASSIGN_OR_RETURN(auto right, Not());
      auto e = Make(Expr::Kind::kAnd);
      e->children.push_back(std::move(left));
      e->children.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  // Rendering recurses over the tree, so its size (and with it its depth) is bounded.
  absl::Status CheckSize() const {
    if (nodes_ > kMaxNodes) {
      return SyntaxError(line_,
                         absl::StrCat("expression too complex (more than ", kMaxNodes, " parts)"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Expr>> Not() {
    RETURN_IF_ERROR(CheckSize());
    if (IsName("not")) {
      ++pos_;
      if (++depth_ > kMaxDepth) return SyntaxError(line_, "expression nested too deeply");
      ASSIGN_OR_RETURN(auto operand, Not());
      --depth_;
      auto e = Make(Expr::Kind::kUnary);
      e->name = "not";
      e->children.push_back(std::move(operand));
      return e;
    }
    return Compare();
  }

  absl::StatusOr<std::unique_ptr<Expr>> Compare() {
    ASSIGN_OR_RETURN(auto left, Concat());
    while (true) {
      std::string op;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">=")) {
        op = toks_[pos_++].text;
      } else if (IsName("in")) {
        ++pos_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        break;
      }
      ASSIGN_OR_RETURN(auto right, Concat());
      auto e = Make(Expr::Kind::kBinary);
      e->name = op;
      e->children.push_back(std::move(left));
      e->children.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  // One left-associative level of binary operators: operand (op operand)*.
  template <typename Next>
  absl::StatusOr<std::unique_ptr<Expr>> BinaryLevel(std::initializer_list<const char*> ops,
                                                    Next next) {
    ASSIGN_OR_RETURN(auto left, next());
    while (true) {
      const char* matched = nullptr;
      for (const char* op : ops) {
        if (IsOp(op)) matched = op;
      }
      if (matched == nullptr) return left;
      ++pos_;
      ASSIGN_OR_RETURN(auto right, next());
      auto e = Make(Expr::Kind::kBinary);
      e->name = matched;
      e->children.push_back(std::move(left));
      e->children.push_back(std::move(right));
      left = std::move(e);
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> Concat() {
    return BinaryLevel({"~"}, [this] { return Additive(); });
  }

  absl::StatusOr<std::unique_ptr<Expr>> Additive() {
    return BinaryLevel({"+", "-"}, [this] { return Multiplicative(); });
  }

  absl::StatusOr<std::unique_ptr<Expr>> Multiplicative() {
    return BinaryLevel({"*", "/", "//", "%"}, [this] { return Power(); });
  }

  absl::StatusOr<std::unique_ptr<Expr>> Power() {
    return BinaryLevel({"**"}, [this] { return Unary(true); });
  }

  absl::StatusOr<std::unique_ptr<Expr>> Unary(bool with_filter) {
    RETURN_IF_ERROR(CheckSize());
    std::unique_ptr<Expr> node;
    if (IsOp("-") || IsOp("+")) {
      const std::string op = toks_[pos_++].text;
      if (++depth_ > kMaxDepth) return SyntaxError(line_, "expression nested too deeply");
      ASSIGN_OR_RETURN(auto operand, Unary(false));
      --depth_;
      node = Make(Expr::Kind::kUnary);
      node->name = op;
      node->children.push_back(std::move(operand));
    } else {
      ASSIGN_OR_RETURN(node, Primary());
      ASSIGN_OR_RETURN(node, Postfix(std::move(node)));
    }
    if (with_filter) {
      ASSIGN_OR_RETURN(node, FilterTest(std::move(node)));
    }
    return node;
  }

  absl::Status Arguments(Expr* call) {
    // "(" already consumed.
    while (!Accept(")")) {
      if (Peek().kind == Tok::Kind::kName && IsOp("=", 1)) {
        call->kwarg_names.push_back(toks_[pos_].text);
        pos_ += 2;
        ASSIGN_OR_RETURN(auto value, Expression());
        call->children.push_back(std::move(value));
      } else {
        if (!call->kwarg_names.empty()) {
          return SyntaxError(line_, "positional argument after keyword argument");
        }
        ASSIGN_OR_RETURN(auto value, Expression());
        call->children.push_back(std::move(value));
      }
      if (!IsOp(")")) RETURN_IF_ERROR(Expect(","));
      if (AtEnd()) return SyntaxError(line_, "unclosed '('");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Expr>> Postfix(std::unique_ptr<Expr> node) {
    while (true) {
      RETURN_IF_ERROR(CheckSize());
      if (Accept(".")) {
        auto e = Make(Expr::Kind::kAttr);
        if (Peek().kind == Tok::Kind::kInt) {
          e->kind = Expr::Kind::kIndex;
          auto index = Make(Expr::Kind::kLiteral);
          index->value = Value::Int(toks_[pos_++].i);
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(index));
        } else {
          ASSIGN_OR_RETURN(e->name, ExpectName());
          e->children.push_back(std::move(node));
        }
        node = std::move(e);
      } else if (Accept("[")) {
        std::unique_ptr<Expr> parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[k], Expression());
          }
          if (k < 2 && Accept(":")) {
            slice = true;
          } else {
            break;
          }
        }
        RETURN_IF_ERROR(Expect("]"));
        auto e = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kIndex);
        e->children.push_back(std::move(node));
        if (slice) {
          for (auto& p : parts) e->children.push_back(std::move(p));
        } else {
          if (parts[0] == nullptr) return SyntaxError(line_, "empty subscript");
          e->children.push_back(std::move(parts[0]));
        }
        node = std::move(e);
      } else if (Accept("(")) {
        auto e = Make(Expr::Kind::kCall);
        e->children.push_back(std::move(node));
        RETURN_IF_ERROR(Arguments(e.get()));
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> FilterTest(std::unique_ptr<Expr> node) {
    while (true) {
      RETURN_IF_ERROR(CheckSize());
      if (Accept("|")) {
        auto e = Make(Expr::Kind::kFilter);
        ASSIGN_OR_RETURN(e->name, ExpectName());
        e->children.push_back(std::move(node));
        if (Accept("(")) RETURN_IF_ERROR(Arguments(e.get()));
        node = std::move(e);
      } else if (IsName("is")) {
        ++pos_;
        auto e = Make(Expr::Kind::kTest);
        e->negated = AcceptName("not");
        ASSIGN_OR_RETURN(e->name, ExpectName());
        e->children.push_back(std::move(node));
        if (Accept("(")) {
          RETURN_IF_ERROR(Arguments(e.get()));
        } else if (Peek().kind == Tok::Kind::kInt || Peek().kind == Tok::Kind::kFloat ||
                   Peek().kind == Tok::Kind::kString ||
                   (Peek().kind == Tok::Kind::kName && !IsName("and") && !IsName("or") &&
                    !IsName("else") && !IsName("if") && !IsName("in") && !IsName("not"))) {
          ASSIGN_OR_RETURN(auto arg, Primary());
          e->children.push_back(std::move(arg));
        }
        node = std::move(e);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> Primary() {
    const Tok& t = Peek();
    if (t.kind == Tok::Kind::kString) {
      auto e = Make(Expr::Kind::kLiteral);
      std::string s = toks_[pos_++].text;
      while (Peek().kind == Tok::Kind::kString) s += toks_[pos_++].text;  // "a" "b"
      e->value = Value::String(std::move(s));
      return e;
    }
    if (t.kind == Tok::Kind::kInt || t.kind == Tok::Kind::kFloat) {
      auto e = Make(Expr::Kind::kLiteral);
      e->value = t.kind == Tok::Kind::kInt ? Value::Int(t.i) : Value::Float(t.d);
      ++pos_;
      return e;
    }
    if (t.kind == Tok::Kind::kName) {
      auto e = Make(Expr::Kind::kLiteral);
      if (t.text == "true" || t.text == "True") {
        e->value = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      ++pos_;
      return e;
    }
    if (Accept("(")) {
      ASSIGN_OR_RETURN(auto first, Expression());
      if (Accept(")")) return first;
      auto tuple = Make(Expr::Kind::kList);
      tuple->children.push_back(std::move(first));
      while (Accept(",")) {
        if (IsOp(")")) break;
        ASSIGN_OR_RETURN(auto item, Expression());
        tuple->children.push_back(std::move(item));
      }
      RETURN_IF_ERROR(Expect(")"));
      return tuple;
    }
    if (Accept("[")) {
      auto list = Make(Expr::Kind::kList);
      while (!Accept("]")) {
        ASSIGN_OR_RETURN(auto item, Expression());
        list->children.push_back(std::move(item));
        if (!IsOp("]")) RETURN_IF_ERROR(Expect(","));
        if (AtEnd()) return SyntaxError(line_, "unclosed '['");
      }
      return list;
    }
    if (Accept("{")) {
      auto dict = Make(Expr::Kind::kDict);
      while (!Accept("}")) {
        ASSIGN_OR_RETURN(auto key, Expression());
        RETURN_IF_ERROR(Expect(":"));
        ASSIGN_OR_RETURN(auto value, Expression());
        dict->children.push_back(std::move(key));
        dict->children.push_back(std::move(value));
        if (!IsOp("}")) RETURN_IF_ERROR(Expect(","));
        if (AtEnd()) return SyntaxError(line_, "unclosed '{'");
      }
      return dict;
    }
    return SyntaxError(line_, t.kind == Tok::Kind::kEnd
                                  ? std::string("unexpected end of expression")
                                  : absl::StrCat("unexpected '", t.text, "'"));
  }

 private:
  static constexpr int kMaxNodes = 2000;
  static constexpr int kMaxDepth = 100;
  std::vector<Tok> toks_;
  size_t pos_ = 0;
  int line_;
  int depth_ = 0;
  int nodes_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Statement parser.

class StatementParser {
 public:
  explicit StatementParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  absl::StatusOr<std::unique_ptr<Node>> ParseAll() {
    std::string end;
    ASSIGN_OR_RETURN(auto root, Sequence({}, &end));
    if (!end.empty()) return SyntaxError(line_, absl::StrCat("unexpected '", end, "'"));
    return root;
  }

 private:
  static std::unique_ptr<Node> MakeNode(Node::Kind kind, int line) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = line;
    return n;
  }

  // Parses until one of `stops` (statement keywords) and returns it in *stop with the rest of
  // that statement in rest_.
  absl::StatusOr<std::unique_ptr<Node>> Sequence(const std::vector<std::string>& stops,
                                                 std::string* stop) {
    if (++depth_ > 100) return SyntaxError(line_, "blocks nested too deeply");
    auto seq = MakeNode(Node::Kind::kSequence, line_);
    stop->clear();
    while (index_ < pieces_.size()) {
      const Piece& piece = pieces_[index_++];
      line_ = piece.line;
      if (piece.kind == Piece::Kind::kText) {
        auto n = MakeNode(Node::Kind::kText, piece.line);
        n->text = piece.content;
        seq->bodies.push_back(std::move(n));
        continue;
      }
      ASSIGN_OR_RETURN(std::vector<Tok> toks, Tokenize(piece.content, piece.line));
      ExprParser p(std::move(toks), piece.line);
      if (piece.kind == Piece::Kind::kOutput) {
        auto n = MakeNode(Node::Kind::kOutput, piece.line);
        ASSIGN_OR_RETURN(auto e, p.Expression());
        RETURN_IF_ERROR(p.ExpectEnd());
        n->exprs.push_back(std::move(e));
        seq->bodies.push_back(std::move(n));
        continue;
      }
      ASSIGN_OR_RETURN(const std::string keyword, p.ExpectName());
      for (const std::string& s : stops) {
        if (keyword == s) {
          *stop = keyword;
          parser_ = std::make_unique<ExprParser>(std::move(p));
          --depth_;
          return seq;
        }
      }
      ASSIGN_OR_RETURN(auto node, Statement(keyword, p, piece.line));
      if (node != nullptr) seq->bodies.push_back(std::move(node));
    }
    if (!stops.empty()) {
      return SyntaxError(line_, absl::StrCat("missing '", stops.back(), "'"));
    }
    --depth_;
    return seq;
  }

  absl::StatusOr<std::unique_ptr<Node>> Statement(const std::string& keyword, ExprParser& p,
                                                  int line) {
    std::string stop;
    if (keyword == "if") {
      auto n = MakeNode(Node::Kind::kIf, line);
      ASSIGN_OR_RETURN(auto cond, p.Expression());
      RETURN_IF_ERROR(p.ExpectEnd());
      n->exprs.push_back(std::move(cond));
      while (true) {
        ASSIGN_OR_RETURN(auto body, Sequence({"elif", "else", "endif"}, &stop));
        n->bodies.push_back(std::move(body));
        if (stop == "elif") {
          ASSIGN_OR_RETURN(auto c, parser_->Expression());
          RETURN_IF_ERROR(parser_->ExpectEnd());
          n->exprs.push_back(std::move(c));
          continue;
        }
        if (stop == "else") {
          RETURN_IF_ERROR(parser_->ExpectEnd());
          ASSIGN_OR_RETURN(auto other, Sequence({"endif"}, &stop));
          n->bodies.push_back(std::move(other));
          n->has_else = true;
        }
        RETURN_IF_ERROR(parser_->ExpectEnd());
        return n;
      }
    }
    if (keyword == "for") {
      auto n = MakeNode(Node::Kind::kFor, line);
      do {
        ASSIGN_OR_RETURN(std::string target, p.ExpectName());
        n->targets.push_back(std::move(target));
      } while (p.Accept(","));
      if (!p.AcceptName("in")) return SyntaxError(line, "expected 'in' in for");
      ASSIGN_OR_RETURN(auto iterable, p.Or());
      n->exprs.push_back(std::move(iterable));
      if (p.AcceptName("if")) {
        ASSIGN_OR_RETURN(auto filter, p.Expression());
        n->exprs.push_back(std::move(filter));
      }
      if (p.AcceptName("recursive")) return SyntaxError(line, "recursive loops are not supported");
      RETURN_IF_ERROR(p.ExpectEnd());
      ASSIGN_OR_RETURN(auto body, Sequence({"else", "endfor"}, &stop));
      n->bodies.push_back(std::move(body));
      if (stop == "else") {
        RETURN_IF_ERROR(parser_->ExpectEnd());
        ASSIGN_OR_RETURN(auto other, Sequence({"endfor"}, &stop));
        n->bodies.push_back(std::move(other));
        n->has_else = true;
      }
      RETURN_IF_ERROR(parser_->ExpectEnd());
      return n;
    }
    if (keyword == "set") {
      ASSIGN_OR_RETURN(std::string target, p.ExpectName());
      std::string attribute;
      if (p.Accept(".")) {
        ASSIGN_OR_RETURN(attribute, p.ExpectName());
      }
      if (p.AtEnd()) {
        auto n = MakeNode(Node::Kind::kSetBlock, line);
        n->text = target;
        n->attribute = attribute;
        ASSIGN_OR_RETURN(auto body, Sequence({"endset"}, &stop));
        RETURN_IF_ERROR(parser_->ExpectEnd());
        n->bodies.push_back(std::move(body));
        return n;
      }
      auto n = MakeNode(Node::Kind::kSet, line);
      n->text = target;
      n->attribute = attribute;
      RETURN_IF_ERROR(p.Expect("="));
      ASSIGN_OR_RETURN(auto value, p.Expression());
      RETURN_IF_ERROR(p.ExpectEnd());
      n->exprs.push_back(std::move(value));
      return n;
    }
    if (keyword == "macro") {
      auto n = MakeNode(Node::Kind::kMacro, line);
      ASSIGN_OR_RETURN(n->text, p.ExpectName());
      RETURN_IF_ERROR(p.Expect("("));
      while (!p.Accept(")")) {
        ASSIGN_OR_RETURN(std::string param, p.ExpectName());
        n->targets.push_back(param);
        std::unique_ptr<Expr> default_value;
        if (p.Accept("=")) {
          ASSIGN_OR_RETURN(default_value, p.Expression());
        }
        n->exprs.push_back(std::move(default_value));
        if (!p.IsOp(")")) RETURN_IF_ERROR(p.Expect(","));
        if (p.AtEnd()) return SyntaxError(line, "unclosed macro parameters");
      }
      RETURN_IF_ERROR(p.ExpectEnd());
      ASSIGN_OR_RETURN(auto body, Sequence({"endmacro"}, &stop));
      n->bodies.push_back(std::move(body));
      return n;
    }
    if (keyword == "break" || keyword == "continue") {
      RETURN_IF_ERROR(p.ExpectEnd());
      return MakeNode(keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line);
    }
    if (keyword == "generation" || keyword == "endgeneration") {
      return std::unique_ptr<Node>();  // HF's AssistantTracker markers: no output of their own
    }
    return SyntaxError(line, absl::StrCat("unknown or misplaced statement '", keyword, "'"));
  }

  std::vector<Piece> pieces_;
  size_t index_ = 0;
  int line_ = 1;
  int depth_ = 0;
  std::unique_ptr<ExprParser> parser_;  // the parser of the statement that ended a Sequence
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Piece> pieces, SplitTemplate(source));
  StatementParser parser(std::move(pieces));
  ASSIGN_OR_RETURN(std::unique_ptr<Node> root, parser.ParseAll());
  auto t = std::unique_ptr<Template>(new Template());
  t->source_ = std::string(source);
  t->root_ = std::move(root);
  return t;
}

absl::StatusOr<Rendered> Template::Render(const std::map<std::string, Value>& context,
                                          const RenderLimits& limits) const {
  return RenderTree(*root_, context, limits);
}

}  // namespace ferry::jinja
