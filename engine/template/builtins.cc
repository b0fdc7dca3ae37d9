#include "engine/template/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"

namespace ferry::jinja {
namespace {

// The part [begin, begin + len) of a string value, keeping the user spans inside it.
Value Substring(const Value& s, size_t begin, size_t len) {
  len = std::min(len, s.str().size() - std::min(begin, s.str().size()));
  std::vector<UserSpan> spans;
  for (const UserSpan& span : s.spans()) {
    const size_t b = std::max(span.begin, begin), e = std::min(span.end, begin + len);
    if (b < e) spans.push_back({b - begin, e - begin});
  }
  return Value::StringWithSpans(s.str().substr(begin, len), std::move(spans));
}

// A new string derived from `from` by a transformation: user text if any of `from` was.
Value Derived(std::string text, const Value& from) {
  return Value::String(std::move(text), from.is_string() && !from.spans().empty());
}

bool IsPySpace(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x1f;
}

Value Strip(const Value& s, const Value& chars, bool left, bool right) {
  const std::string& t = s.str();
  auto strip_char = [&](unsigned char c) {
    if (chars.is_none() || chars.is_undefined()) return IsPySpace(c);
    return chars.str().find(static_cast<char>(c)) != std::string::npos;
  };
  size_t b = 0, e = t.size();
  if (left) {
    while (b < e && strip_char(static_cast<unsigned char>(t[b]))) ++b;
  }
  if (right) {
    while (e > b && strip_char(static_cast<unsigned char>(t[e - 1]))) --e;
  }
  return Substring(s, b, e - b);
}

std::string PyTitle(const std::string& s) {
  std::string out = s;
  bool previous_cased = false;
  for (char& c : out) {
    const bool letter = absl::ascii_isalpha(static_cast<unsigned char>(c));
    if (letter) c = previous_cased ? absl::ascii_tolower(c) : absl::ascii_toupper(c);
    previous_cased = letter;
  }
  return out;
}

std::string PyCapitalize(const std::string& s) {
  std::string out = absl::AsciiStrToLower(s);
  if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
  return out;
}

Value Kwarg(const Kwargs& kwargs, absl::string_view name, const Args& args, size_t pos,
            Value fallback = Value()) {
  for (const auto& kv : kwargs) {
    if (kv.first == name) return kv.second;
  }
  return pos < args.size() ? args[pos] : fallback;
}

std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t i = 0;
  while (count != 0) {
    const size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    if (count > 0) --count;
  }
  out.append(s, i, std::string::npos);
  return out;
}

}  // namespace

absl::Status Error(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("template error, line ", line, ": ", what));
}

// ---- global functions ----

void AddGlobalFunctions(std::map<std::string, Value>& globals) {
  globals["raise_exception"] =
      Value::MakeFunction([](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
        return absl::InvalidArgumentError(
            absl::StrCat("raise_exception: ", args.empty() ? "" : args[0].ToString()));
      });
  globals["namespace"] =
      Value::MakeFunction([](const Args& args, const Kwargs& kwargs) -> absl::StatusOr<Value> {
        Dict attrs;
        for (const Value& a : args) {
          if (a.is_dict()) {
            for (const auto& kv : a.dict()) attrs.push_back(kv);
          }
        }
        for (const auto& kv : kwargs) attrs.push_back(kv);
        return Value::MakeDict(std::move(attrs), /*is_namespace=*/true);
      });
  globals["range"] =
      Value::MakeFunction([](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
        int64_t start = 0, stop = 0, step = 1;
        if (args.size() == 1) {
          stop = args[0].int_value();
        } else if (args.size() >= 2) {
          start = args[0].int_value();
          stop = args[1].int_value();
          if (args.size() == 3) step = args[2].int_value();
        }
        if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
        List items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (items.size() >= 1'000'000) return absl::ResourceExhaustedError("range() too long");
          items.push_back(Value::Int(i));
        }
        return Value::MakeList(std::move(items));
      });
  globals["strftime_now"] =
      Value::MakeFunction([](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
        const std::time_t now = std::time(nullptr);
        std::tm tm;
        localtime_r(&now, &tm);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof(buf),
                                       args.empty() ? "%Y-%m-%d" : args[0].ToString().c_str(), &tm);
        return Value::String(std::string(buf, n));
      });
}

// ---- protocols ----

absl::StatusOr<List> Iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return List();
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& kv : v.dict()) keys.push_back(Value::String(kv.first));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      const std::string& s = v.str();
      size_t i = 0;
      while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        chars.push_back(Substring(v, i, n));
        i += n;
      }
      return chars;
    }
    default:
      return Error(line, absl::StrCat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (!item.is_string()) return Error(line, "'in <string>' requires a string on the left");
    return container.str().find(item.str()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.list()) {
      if (v == item) return true;
    }
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.Find(item.str()) != nullptr;
  if (container.is_undefined()) return false;
  return Error(line, absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
}

// ---- methods ----

absl::StatusOr<Value> StringMethod(const Value& s, const std::string& name, int line) {
  auto method = [](auto fn) { return Value::MakeFunction(fn); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return method([s, left, right](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
      return Strip(s, args.empty() ? Value() : args[0], left, right);
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return method([s, name](const Args&, const Kwargs&) -> absl::StatusOr<Value> {
      const std::string& t = s.str();
      return Derived(name == "upper"   ? absl::AsciiStrToUpper(t)
                     : name == "lower" ? absl::AsciiStrToLower(t)
                     : name == "title" ? PyTitle(t)
                                       : PyCapitalize(t),
                     s);
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool starts = name == "startswith";
    return method([s, starts](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
      if (args.empty()) return absl::InvalidArgumentError("startswith/endswith need an argument");
      List options = args[0].is_list() ? args[0].list() : List{args[0]};
      for (const Value& o : options) {
        if (!o.is_string()) return absl::InvalidArgumentError("startswith/endswith take strings");
        if (starts ? absl::StartsWith(s.str(), o.str()) : absl::EndsWith(s.str(), o.str())) {
          return Value::Bool(true);
        }
      }
      return Value::Bool(false);
    });
  }
  if (name == "split" || name == "rsplit") {
    return method([s](const Args& args, const Kwargs& kwargs) -> absl::StatusOr<Value> {
      const Value sep = Kwarg(kwargs, "sep", args, 0, Value::None());
      const Value max = Kwarg(kwargs, "maxsplit", args, 1, Value::Int(-1));
      int64_t remaining = max.kind() == Value::Kind::kInt ? max.int_value() : -1;
      List parts;
      const std::string& t = s.str();
      if (sep.is_none() || sep.is_undefined()) {
        size_t i = 0;
        while (i < t.size()) {
          while (i < t.size() && IsPySpace(static_cast<unsigned char>(t[i]))) ++i;
          if (i >= t.size()) break;
          size_t j = i;
          if (remaining == 0) {
            j = t.size();
            while (j > i && IsPySpace(static_cast<unsigned char>(t[j - 1]))) --j;
          } else {
            while (j < t.size() && !IsPySpace(static_cast<unsigned char>(t[j]))) ++j;
          }
          parts.push_back(Substring(s, i, j - i));
          if (remaining > 0) --remaining;
          i = j;
          if (remaining == 0 && j < t.size()) {
            // the rest, with leading whitespace stripped
            size_t k = j;
            while (k < t.size() && IsPySpace(static_cast<unsigned char>(t[k]))) ++k;
            if (k < t.size()) parts.push_back(Substring(s, k, t.size() - k));
            break;
          }
        }
        return Value::MakeList(std::move(parts));
      }
      if (!sep.is_string() || sep.str().empty())
        return absl::InvalidArgumentError("empty separator");
      size_t i = 0;
      while (true) {
        const size_t j = remaining == 0 ? std::string::npos : t.find(sep.str(), i);
        if (j == std::string::npos) {
          parts.push_back(Substring(s, i, t.size() - i));
          break;
        }
        parts.push_back(Substring(s, i, j - i));
        i = j + sep.str().size();
        if (remaining > 0) --remaining;
      }
      return Value::MakeList(std::move(parts));
    });
  }
  if (name == "replace") {
    return method([s](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
      if (args.size() < 2 || !args[0].is_string() || !args[1].is_string()) {
        return absl::InvalidArgumentError("replace() takes two strings");
      }
      return Derived(ReplaceAll(s.str(), args[0].str(), args[1].str(),
                                args.size() > 2 ? args[2].int_value() : -1),
                     s.spans().empty() ? args[1] : s);
    });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return method([s, find](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
      if (args.empty() || !args[0].is_string()) return absl::InvalidArgumentError("needs a string");
      if (find) {
        const size_t at = s.str().find(args[0].str());
        return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(at));
      }
      int64_t n = 0;
      for (size_t at = s.str().find(args[0].str());
           at != std::string::npos && !args[0].str().empty();
           at = s.str().find(args[0].str(), at + args[0].str().size())) {
        ++n;
      }
      return Value::Int(n);
    });
  }
  if (name == "join") {
    return method([s](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
      if (args.empty() || !args[0].is_list())
        return absl::InvalidArgumentError("join() takes a list");
      Value out = Value::String("");
      for (size_t i = 0; i < args[0].list().size(); ++i) {
        if (i > 0) out = Concat(out, s);
        out = Concat(out, args[0].list()[i].ToStringValue());
      }
      return out;
    });
  }
  (void)line;
  return Value();
}

Value DictMethod(const Value& d, const std::string& name) {
  return Value::MakeFunction([d, name](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
    if (name == "get") {
      if (args.empty() || !args[0].is_string()) return args.size() > 1 ? args[1] : Value::None();
      const Value* v = d.Find(args[0].str());
      return v != nullptr ? *v : (args.size() > 1 ? args[1] : Value::None());
    }
    List out;
    for (const auto& [k, v] : d.dict()) {
      if (name == "items") {
        out.push_back(Value::MakeList({Value::String(k), v}));
      } else if (name == "keys") {
        out.push_back(Value::String(k));
      } else {
        out.push_back(v);
      }
    }
    return Value::MakeList(std::move(out));
  });
}

// ---- filters and tests ----

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args,
                                  const Kwargs& kwargs, int line) {
  if (name == "trim") return Strip(v.ToStringValue(), Kwarg(kwargs, "chars", args, 0), true, true);
  if (name == "tojson") {
    const Value indent = Kwarg(kwargs, "indent", args, 0);
    ASSIGN_OR_RETURN(
        std::string json,
        v.ToJson(indent.kind() == Value::Kind::kInt ? static_cast<int>(indent.int_value()) : 0));
    bool user = false;
    std::function<void(const Value&)> scan = [&](const Value& x) {
      if (x.is_string()) user = user || !x.spans().empty();
      if (x.is_list())
        for (const Value& y : x.list()) scan(y);
      if (x.is_dict())
        for (const auto& kv : x.dict()) scan(kv.second);
    };
    scan(v);
    return Value::String(std::move(json), user);
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) {
      ASSIGN_OR_RETURN(List chars, Iterate(v, line));
      return Value::Int(static_cast<int64_t>(chars.size()));
    }
    if (v.is_list()) return Value::Int(static_cast<int64_t>(v.list().size()));
    if (v.is_dict()) return Value::Int(static_cast<int64_t>(v.dict().size()));
    if (v.is_undefined()) return Value::Int(0);
    return Error(line, absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
  if (name == "default" || name == "d") {
    const Value fallback = Kwarg(kwargs, "default_value", args, 0, Value::String(""));
    const bool boolean = Kwarg(kwargs, "boolean", args, 1, Value::Bool(false)).Truthy();
    if (v.is_undefined() || (boolean && !v.Truthy())) return fallback;
    return v;
  }
  if (name == "join") {
    const Value sep = Kwarg(kwargs, "d", args, 0, Value::String(""));
    const Value attribute = Kwarg(kwargs, "attribute", args, 1);
    ASSIGN_OR_RETURN(List items, Iterate(v, line));
    Value out = Value::String("");
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out = Concat(out, sep.ToStringValue());
      Value item = items[i];
      if (attribute.is_string() && item.is_dict()) {
        const Value* a = item.Find(attribute.str());
        item = a != nullptr ? *a : Value();
      }
      out = Concat(out, item.ToStringValue());
    }
    return out;
  }
  if (name == "lower" || name == "upper" || name == "title" || name == "capitalize") {
    const Value s = v.ToStringValue();
    ASSIGN_OR_RETURN(Value fn, StringMethod(s, name, line));
    return fn.function()({}, {});
  }
  if (name == "replace") {
    const Value s = v.ToStringValue();
    ASSIGN_OR_RETURN(Value fn, StringMethod(s, "replace", line));
    return fn.function()(args, kwargs);
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(List items, Iterate(v, line));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeList({});
    if (!v.is_dict()) return Error(line, "items filter needs a mapping");
    return DictMethod(v, "items").function()({}, {});
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(List items, Iterate(v, line));
    return Value::MakeList(std::move(items));
  }
  if (name == "string") return v.ToStringValue();
  if (name == "safe" || name == "e" || name == "escape") {
    if (name == "safe") return v;
    return Error(line, "the escape filter is not supported (HF templates do not autoescape)");
  }
  if (name == "int") {
    if (v.kind() == Value::Kind::kInt) return v;
    if (v.kind() == Value::Kind::kFloat) return Value::Int(static_cast<int64_t>(v.number()));
    if (v.kind() == Value::Kind::kBool) return Value::Int(v.bool_value());
    if (v.is_string()) {
      char* end = nullptr;
      const long long n = std::strtoll(v.str().c_str(), &end, 10);
      if (end != nullptr && *end == '\0' && !v.str().empty()) return Value::Int(n);
    }
    return Kwarg(kwargs, "default", args, 0, Value::Int(0));
  }
  if (name == "float") {
    if (v.is_number()) return Value::Float(v.number());
    if (v.is_string()) {
      char* end = nullptr;
      const double d = std::strtod(v.str().c_str(), &end);
      if (end != nullptr && *end == '\0' && !v.str().empty()) return Value::Float(d);
    }
    return Kwarg(kwargs, "default", args, 0, Value::Float(0));
  }
  if (name == "abs") {
    if (!v.is_number()) return Error(line, "abs needs a number");
    return v.kind() == Value::Kind::kInt ? Value::Int(std::llabs(v.int_value()))
                                         : Value::Float(std::fabs(v.number()));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::string r(v.str().rbegin(), v.str().rend());
      return Derived(std::move(r), v);
    }
    ASSIGN_OR_RETURN(List items, Iterate(v, line));
    std::reverse(items.begin(), items.end());
    return Value::MakeList(std::move(items));
  }
  if (name == "unique") {
    ASSIGN_OR_RETURN(List items, Iterate(v, line));
    List out;
    for (const Value& x : items) {
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "indent") {
    const int64_t width = Kwarg(kwargs, "width", args, 0, Value::Int(4)).int_value();
    const bool first = Kwarg(kwargs, "first", args, 1, Value::Bool(false)).Truthy();
    const std::string pad(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(width, 1000))),
                          ' ');
    const std::string& s = v.ToString();
    std::string out = first ? pad : "";
    for (size_t i = 0; i < s.size(); ++i) {
      out += s[i];
      if (s[i] == '\n' && i + 1 < s.size() && s[i + 1] != '\n') out += pad;
    }
    return Derived(std::move(out), v);
  }
  if (name == "map") {
    ASSIGN_OR_RETURN(List items, Iterate(v, line));
    const Value attribute = Kwarg(kwargs, "attribute", {}, 0);
    List out;
    for (const Value& item : items) {
      if (attribute.is_string()) {
        const Value* a = item.is_dict() ? item.Find(attribute.str()) : nullptr;
        out.push_back(a != nullptr ? *a : Kwarg(kwargs, "default", {}, 0));
      } else {
        if (args.empty() || !args[0].is_string())
          return Error(line, "map needs a filter name or attribute=");
        Args rest(args.begin() + 1, args.end());
        ASSIGN_OR_RETURN(Value mapped, ApplyFilter(args[0].str(), item, rest, {}, line));
        out.push_back(std::move(mapped));
      }
    }
    return Value::MakeList(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    ASSIGN_OR_RETURN(List items, Iterate(v, line));
    size_t k = 0;
    Value attribute;
    if (attr) {
      if (args.empty() || !args[0].is_string())
        return Error(line, absl::StrCat(name, " needs an attribute name"));
      attribute = args[0];
      k = 1;
    }
    const std::string test = k < args.size() && args[k].is_string() ? args[k].str() : "";
    Args rest(args.begin() + std::min(args.size(), k + 1), args.end());
    List out;
    for (const Value& item : items) {
      Value subject = item;
      if (attr) {
        const Value* a = item.is_dict() ? item.Find(attribute.str()) : nullptr;
        subject = a != nullptr ? *a : Value();
      }
      bool pass = subject.Truthy();
      if (!test.empty()) {
        ASSIGN_OR_RETURN(pass, ApplyTest(test, subject, rest, line));
      }
      if (pass == keep_if) out.push_back(item);
    }
    return Value::MakeList(std::move(out));
  }
  return Error(line, absl::StrCat("unknown filter '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Args& args,
                               int line) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_string() || v.is_dict();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.bool_value();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.bool_value();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (v.kind() != Value::Kind::kInt) return Error(line, "odd/even need an integer");
    return (v.int_value() % 2 != 0) == (name == "odd");
  }
  if (args.empty())
    return Error(line, absl::StrCat("unknown test '", name, "' or missing argument"));
  const Value& other = args[0];
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return v == other;
  if (name == "ne" || name == "!=") return v != other;
  if (name == "in") {
    ASSIGN_OR_RETURN(bool found, Contains(other, v, line));
    return found;
  }
  if (name == "divisibleby") {
    if (v.kind() != Value::Kind::kInt || other.kind() != Value::Kind::kInt ||
        other.int_value() == 0) {
      return Error(line, "divisibleby needs non-zero integers");
    }
    return v.int_value() % other.int_value() == 0;
  }
  if (name == "lt" || name == "gt" || name == "le" || name == "ge") {
    if (!v.is_number() || !other.is_number()) return Error(line, "comparison tests need numbers");
    const double a = v.number(), b = other.number();
    return name == "lt" ? a < b : name == "gt" ? a > b : name == "le" ? a <= b : a >= b;
  }
  return Error(line, absl::StrCat("unknown test '", name, "'"));
}

}  // namespace ferry::jinja
