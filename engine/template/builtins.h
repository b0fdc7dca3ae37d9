// The builtins of the Jinja-subset interpreter (template.h): the filters (`x | tojson`), tests
// (`x is defined`), global functions (range, namespace, raise_exception, strftime_now) and the
// methods of strings and dicts (`s.strip()`, `d.items()`) that chat templates use, with the
// semantics of jinja2 and Python (and HF's tojson), string transformations keeping user spans.
// Also the two Python protocols the renderer shares with them: iteration and `in`.
//
// Private to engine/template: renderer.cc evaluates statements and expressions and calls these.
// Stateless functions, thread-safe. Errors are Status values naming the template line, except
// those of function values (methods, globals), which the renderer prefixes with the line of the
// call.

#ifndef FERRY_ENGINE_TEMPLATE_BUILTINS_H_
#define FERRY_ENGINE_TEMPLATE_BUILTINS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/template/value.h"

namespace ferry::jinja {

// The error for a fault at template line `line`: "template error, line N: what".
absl::Status Error(int line, absl::string_view what);

// Python iteration: a list's items, a dict's keys, a string's UTF-8 characters (each keeping its
// user spans); undefined iterates as empty, anything else is an error.
absl::StatusOr<List> Iterate(const Value& v, int line);

// Python `item in container`: a substring, a list element, a dict key; never in undefined.
absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line);

// Sets the global functions in `globals` (over context variables of the same names).
void AddGlobalFunctions(std::map<std::string, Value>& globals);

// `s.name` for a string s: the bound method as a function value, undefined if there is none.
absl::StatusOr<Value> StringMethod(const Value& s, const std::string& name, int line);

// `d.name` for a dict d and name one of items, keys, values, get: the bound method.
Value DictMethod(const Value& d, const std::string& name);

// `v | name(args, kwargs)`.
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, const Args& args,
                                  const Kwargs& kwargs, int line);

// `v is name(args)`, before any `not`.
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Args& args, int line);

}  // namespace ferry::jinja

#endif  // FERRY_ENGINE_TEMPLATE_BUILTINS_H_
