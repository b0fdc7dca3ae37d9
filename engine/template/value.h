// Values of the Jinja-subset interpreter (template.h): what Python values are to jinja2, with the
// Python semantics chat templates rely on (truthiness, equality, str(), ordering of dict keys).
//
// Strings remember which of their bytes came from users (message contents, tool results, tool
// definitions) rather than from the template, so that the rendered prompt can be tokenized with
// injection safety: template text may produce special tokens, user text never does.
//
// Lists and dicts are shared references, as in Python; the interpreter never mutates them (HF
// renders in jinja2's immutable sandbox), except namespace objects.
//
// Dicts keep their insertion order (a vector of items). A dict of more than kIndexedDictItems
// items (a tool schema's properties, a user's JSON object) also gets a hash index of its keys when
// it is made, so that Find, `d[key]`, `key in d` and == take constant time per key: a template
// that looks up each of a dict's keys in a loop stays linear in the dict's size. Namespaces,
// which assignments change, are scanned.

#ifndef FERRY_ENGINE_TEMPLATE_VALUE_H_
#define FERRY_ENGINE_TEMPLATE_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace ferry::jinja {

// A byte range of a string that came from user input.
struct UserSpan {
  size_t begin;
  size_t end;
};

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like Python's
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<absl::StatusOr<Value>(const Args&, const Kwargs&)>;

// Dicts of more items than this are indexed (a scan of a few keys is as fast).
inline constexpr size_t kIndexedDictItems = 16;

// A dict's items and, when it has more than kIndexedDictItems and is not a namespace, the
// position of each key's first item (the index points into `items`, which then never changes).
struct DictData {
  DictData() = default;
  DictData(const DictData&) = delete;
  DictData& operator=(const DictData&) = delete;

  Dict items;
  absl::flat_hash_map<absl::string_view, size_t> index;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s, bool user = false);
  static Value StringWithSpans(std::string s, std::vector<UserSpan> spans);
  static Value MakeList(List items);
  static Value MakeDict(Dict items, bool is_namespace = false);
  static Value MakeFunction(Function f);
  // From JSON (message lists, tools), keeping the order of object keys (Python dicts do, and
  // templates print them with tojson). Every string becomes user text unless `user` is false.
  static Value FromJson(const nlohmann::ordered_json& json, bool user);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && is_namespace_; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return i_; }
  double number() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& str() const { return *s_; }
  const std::vector<UserSpan>& spans() const { return *spans_; }
  const List& list() const { return *list_; }
  const Dict& dict() const { return dict_->items; }
  Dict& mutable_dict() const { return dict_->items; }  // namespaces only (never indexed)
  const Function& function() const { return *fn_; }

  // Dict lookup (the first item of that key); nullptr when absent.
  const Value* Find(absl::string_view key) const;

  bool Truthy() const;
  // Python str(): "True", "None", "[1, 'a']", "{'k': 'v'}"; undefined is "".
  std::string ToString() const;
  // ToString() keeping user spans (strings keep theirs; other kinds are template text).
  Value ToStringValue() const;
  // Python repr() of strings inside containers.
  std::string Repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent) with Python's separators.
  absl::StatusOr<std::string> ToJson(int indent) const;

  // Python ==.
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

  const char* TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool is_namespace_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::shared_ptr<const std::string> s_;
  std::shared_ptr<const std::vector<UserSpan>> spans_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<const Function> fn_;
};

// Concatenates strings, keeping user spans.
Value Concat(const Value& a, const Value& b);

}  // namespace ferry::jinja

#endif  // FERRY_ENGINE_TEMPLATE_VALUE_H_
