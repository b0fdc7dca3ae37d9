#include "engine/template/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace ferry::jinja {
namespace {

const std::vector<UserSpan>& NoSpans() {
  static const auto* empty = new std::vector<UserSpan>();
  return *empty;
}

// Python's repr() of a float: the shortest digits that round-trip, fixed notation for decimal
// exponents in [-4, 16), scientific otherwise; always a '.' or an exponent.
std::string PythonFloat(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf = "-d.ddde+XX": split mantissa digits and exponent.
  std::string s = buf;
  const bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += absl::StrFormat("e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  return negative ? "-" + out : out;
}

void AppendJsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          *out += absl::StrFormat("\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

absl::Status AppendJson(const Value& v, int indent, int depth, std::string* out) {
  if (depth > 100) return absl::InvalidArgumentError("tojson: value nested too deeply");
  const std::string newline = indent > 0 ? "\n" + std::string((depth + 1) * indent, ' ') : "";
  const std::string closing = indent > 0 ? "\n" + std::string(depth * indent, ' ') : "";
  const char* item_sep = indent > 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.number();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PythonFloat(d);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(v.str(), out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += "[";
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i > 0) *out += item_sep;
        *out += newline;
        if (auto s = AppendJson(v.list()[i], indent, depth + 1, out); !s.ok()) return s;
      }
      *out += closing + "]";
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.dict().empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      *out += "{";
      for (size_t i = 0; i < v.dict().size(); ++i) {
        if (i > 0) *out += item_sep;
        *out += newline;
        AppendJsonString(v.dict()[i].first, out);
        *out += ": ";
        if (auto s = AppendJson(v.dict()[i].second, indent, depth + 1, out); !s.ok()) return s;
      }
      *out += closing + "}";
      return absl::OkStatus();
    }
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError("tojson: a function is not JSON serializable");
  }
  return absl::OkStatus();
}

}  // namespace

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.d_ = d;
  return v;
}

Value Value::String(std::string s, bool user) {
  std::vector<UserSpan> spans;
  if (user && !s.empty()) spans.push_back({0, s.size()});
  return StringWithSpans(std::move(s), std::move(spans));
}

Value Value::StringWithSpans(std::string s, std::vector<UserSpan> spans) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  v.spans_ = spans.empty() ? std::shared_ptr<const std::vector<UserSpan>>(
                                 std::shared_ptr<const std::vector<UserSpan>>(), &NoSpans())
                           : std::make_shared<const std::vector<UserSpan>>(std::move(spans));
  return v;
}

Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::MakeDict(Dict items, bool is_namespace) {
  Value v;
  v.kind_ = Kind::kDict;
  v.is_namespace_ = is_namespace;
  v.dict_ = std::make_shared<DictData>();
  v.dict_->items = std::move(items);
  if (!is_namespace && v.dict_->items.size() > kIndexedDictItems) {
    const Dict& d = v.dict_->items;
    v.dict_->index.reserve(d.size());
    for (size_t i = 0; i < d.size(); ++i) v.dict_->index.emplace(d[i].first, i);  // first wins
  }
  return v;
}

Value Value::MakeFunction(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& json, bool user) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Int(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Float(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(json.get<std::string>(), user);
    case nlohmann::ordered_json::value_t::array: {
      List items;
      for (const auto& e : json) items.push_back(FromJson(e, user));
      return MakeList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict items;
      for (auto it = json.begin(); it != json.end(); ++it) {
        items.emplace_back(it.key(), FromJson(it.value(), user));
      }
      return MakeDict(std::move(items));
    }
    default:
      return Value();
  }
}

const Value* Value::Find(absl::string_view key) const {
  if (kind_ != Kind::kDict) return nullptr;
  const Dict& items = dict_->items;
  if (!dict_->index.empty()) {
    auto it = dict_->index.find(key);
    return it == dict_->index.end() ? nullptr : &items[it->second].second;
  }
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_->empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return is_namespace_ || !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::Repr() const {
  if (kind_ != Kind::kString) return ToString();
  const std::string& s = *s_;
  const char quote =
      (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return PythonFloat(d_);
    case Kind::kString:
      return *s_;
    case Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr();
      }
      return out + "]";
    }
    case Kind::kDict: {
      if (is_namespace_) return "<Namespace>";
      std::string out = "{";
      const Dict& items = dict_->items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        out += Value::String(items[i].first).Repr() + ": " + items[i].second.Repr();
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

Value Value::ToStringValue() const {
  if (kind_ == Kind::kString) return *this;
  // Containers print user strings inside them: keep the whole rendering as user text then.
  bool user = false;
  if (kind_ == Kind::kList) {
    for (const Value& v : *list_) user = user || (v.is_string() && !v.spans().empty());
  }
  if (kind_ == Kind::kDict) {
    for (const auto& [k, v] : dict_->items) user = user || (v.is_string() && !v.spans().empty());
  }
  return String(ToString(), user);
}

absl::StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  if (auto s = AppendJson(*this, indent, 0, &out); !s.ok()) return s;
  return out;
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt) {
      return a.int_value() == b.int_value();
    }
    return a.number() == b.number();
  }
  // Python: True == 1.
  if (a.kind() == Value::Kind::kBool && b.is_number()) return Value::Int(a.bool_value()) == b;
  if (b.kind() == Value::Kind::kBool && a.is_number()) return a == Value::Int(b.bool_value());
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kBool:
      return a.bool_value() == b.bool_value();
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList:
      return a.list() == b.list();
    case Value::Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict()) {
        const Value* other = b.Find(k);
        if (other == nullptr || !(*other == v)) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return is_namespace_ ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

Value Concat(const Value& a, const Value& b) {
  std::vector<UserSpan> spans = a.spans();
  const size_t offset = a.str().size();
  for (const UserSpan& s : b.spans()) {
    if (!spans.empty() && spans.back().end == s.begin + offset) {
      spans.back().end = s.end + offset;  // merge adjacent user spans
    } else {
      spans.push_back({s.begin + offset, s.end + offset});
    }
  }
  return Value::StringWithSpans(a.str() + b.str(), std::move(spans));
}

}  // namespace ferry::jinja
