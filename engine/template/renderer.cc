// Evaluation of a parsed template: statements and expressions, with jinja2's semantics as HF
// configures it (immutable sandbox, loop controls); the filters, tests, global functions and
// methods it calls are in builtins.h.

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/template/builtins.h"
#include "engine/template/syntax_tree.h"

namespace ferry::jinja {
namespace {

class Renderer {
 public:
  Renderer(const std::map<std::string, Value>& context, const RenderLimits& limits)
      : limits_(limits) {
    scopes_.emplace_back();
    for (const auto& [k, v] : context) scopes_[0][k] = v;
    AddGlobalFunctions(scopes_[0]);
    outputs_.emplace_back();
  }

  absl::StatusOr<Rendered> Run(const Node& root) {
    ASSIGN_OR_RETURN(Flow flow, Exec(root));
    (void)flow;
    return std::move(outputs_.back());
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::Status Step(int line) {
    if (++steps_ > limits_.max_steps) {
      return absl::ResourceExhaustedError(absl::StrCat("template error, line ", line,
                                                       ": more than ", limits_.max_steps,
                                                       " evaluation steps (a runaway loop?)"));
    }
    return absl::OkStatus();
  }

  absl::Status Emit(const Value& v, int line) {
    Rendered& out = outputs_.back();
    const Value s = v.ToStringValue();
    const size_t offset = out.text.size();
    if (offset + s.str().size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "template error, line ", line, ": output exceeds ", limits_.max_output_bytes, " bytes"));
    }
    out.text += s.str();
    for (const UserSpan& span : s.spans()) {
      if (!out.user_spans.empty() && out.user_spans.back().end == span.begin + offset) {
        out.user_spans.back().end = span.end + offset;
      } else {
        out.user_spans.push_back({span.begin + offset, span.end + offset});
      }
    }
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value();
  }

  // ---- statements ----

  absl::StatusOr<Flow> Exec(const Node& node) {
    RETURN_IF_ERROR(Step(node.line));
    switch (node.kind) {
      case Node::Kind::kSequence:
        for (const auto& child : node.bodies) {
          ASSIGN_OR_RETURN(Flow flow, Exec(*child));
          if (flow != Flow::kNormal) return flow;
        }
        return Flow::kNormal;
      case Node::Kind::kText:
        RETURN_IF_ERROR(Emit(Value::String(node.text), node.line));
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.exprs[0]));
        RETURN_IF_ERROR(Emit(v, node.line));
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (size_t i = 0; i < node.exprs.size(); ++i) {
          ASSIGN_OR_RETURN(Value cond, Eval(*node.exprs[i]));
          if (cond.Truthy()) return Exec(*node.bodies[i]);
        }
        if (node.has_else) return Exec(*node.bodies.back());
        return Flow::kNormal;
      case Node::Kind::kFor:
        return ExecFor(node);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*node.exprs[0]));
        return Assign(node, std::move(v));
      }
      case Node::Kind::kSetBlock: {
        outputs_.emplace_back();
        auto flow = Exec(*node.bodies[0]);
        Rendered captured = std::move(outputs_.back());
        outputs_.pop_back();
        RETURN_IF_ERROR(flow.status());
        return Assign(
            node, Value::StringWithSpans(std::move(captured.text), std::move(captured.user_spans)));
      }
      case Node::Kind::kMacro: {
        const Node* macro = &node;
        scopes_.back()[node.text] =
            Value::MakeFunction([this, macro](const Args& args, const Kwargs& kwargs) {
              return CallMacro(*macro, args, kwargs);
            });
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> Assign(const Node& node, Value v) {
    if (node.attribute.empty()) {
      scopes_.back()[node.text] = std::move(v);
      return Flow::kNormal;
    }
    const Value target = Lookup(node.text);
    if (!target.is_namespace()) {
      return Error(node.line, absl::StrCat("cannot assign attribute on non-namespace object '",
                                           node.text, "'"));
    }
    Dict& attrs = target.mutable_dict();
    for (auto& kv : attrs) {
      if (kv.first == node.attribute) {
        kv.second = std::move(v);
        return Flow::kNormal;
      }
    }
    attrs.emplace_back(node.attribute, std::move(v));
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecFor(const Node& node) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*node.exprs[0]));
    ASSIGN_OR_RETURN(List all, Iterate(iterable, node.line));
    scopes_.emplace_back();
    // Apply the loop filter first: loop.length counts what remains.
    List items;
    for (const Value& item : all) {
      if (node.exprs.size() > 1) {
        RETURN_IF_ERROR(Bind(node, item));
        ASSIGN_OR_RETURN(Value keep, Eval(*node.exprs[1]));
        if (!keep.Truthy()) continue;
      }
      items.push_back(item);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      RETURN_IF_ERROR(Bind(node, items[i]));
      Dict loop = {
          {"index", Value::Int(i + 1)},
          {"index0", Value::Int(i)},
          {"revindex", Value::Int(n - i)},
          {"revindex0", Value::Int(n - i - 1)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == n - 1)},
          {"length", Value::Int(n)},
          {"previtem", i > 0 ? items[i - 1] : Value()},
          {"nextitem", i + 1 < n ? items[i + 1] : Value()},
      };
      const int64_t index = i;
      loop.emplace_back(
          "cycle",
          Value::MakeFunction([index](const Args& args, const Kwargs&) -> absl::StatusOr<Value> {
            if (args.empty()) return absl::InvalidArgumentError("cycle() needs items");
            return args[index % static_cast<int64_t>(args.size())];
          }));
      scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
      auto flow = Exec(*node.bodies[0]);
      if (!flow.ok()) {
        scopes_.pop_back();
        return flow.status();
      }
      if (*flow == Flow::kBreak) break;
    }
    scopes_.pop_back();
    if (n == 0 && node.has_else) return Exec(*node.bodies[1]);
    return Flow::kNormal;
  }

  absl::Status Bind(const Node& node, const Value& item) {
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = item;
      return absl::OkStatus();
    }
    if (!item.is_list() || item.list().size() != node.targets.size()) {
      return Error(node.line, absl::StrCat("cannot unpack ", item.TypeName(), " into ",
                                           node.targets.size(), " loop variables"));
    }
    for (size_t k = 0; k < node.targets.size(); ++k)
      scopes_.back()[node.targets[k]] = item.list()[k];
    return absl::OkStatus();
  }

  absl::StatusOr<Value> CallMacro(const Node& macro, const Args& args, const Kwargs& kwargs) {
    if (++depth_ > limits_.max_call_depth) {
      --depth_;
      return absl::ResourceExhaustedError(absl::StrCat("template error, line ", macro.line,
                                                       ": macro calls nested more than ",
                                                       limits_.max_call_depth, " deep"));
    }
    if (args.size() > macro.targets.size()) {
      --depth_;
      return Error(macro.line, absl::StrCat("macro '", macro.text, "' takes ", macro.targets.size(),
                                            " arguments"));
    }
    // Macros see the template's globals and their parameters, not the caller's locals.
    std::vector<std::map<std::string, Value>> saved;
    saved.swap(scopes_);
    scopes_.push_back(saved[0]);
    scopes_.emplace_back();
    absl::Status status;
    for (size_t i = 0; i < macro.targets.size() && status.ok(); ++i) {
      Value v;
      if (i < args.size()) {
        v = args[i];
      } else {
        bool found = false;
        for (const auto& kv : kwargs) {
          if (kv.first == macro.targets[i]) {
            v = kv.second;
            found = true;
          }
        }
        if (!found && macro.exprs[i] != nullptr) {
          auto d = Eval(*macro.exprs[i]);
          if (!d.ok())
            status = d.status();
          else
            v = *d;
        }
      }
      scopes_.back()[macro.targets[i]] = v;
    }
    outputs_.emplace_back();
    if (status.ok()) status = Exec(*macro.bodies[0]).status();
    Rendered captured = std::move(outputs_.back());
    outputs_.pop_back();
    // Keep the globals the macro body may have changed? jinja2 macros cannot: drop them.
    scopes_.swap(saved);
    --depth_;
    RETURN_IF_ERROR(status);
    return Value::StringWithSpans(std::move(captured.text), std::move(captured.user_spans));
  }

  // ---- expressions ----

  absl::StatusOr<Value> Eval(const Expr& e) {
    RETURN_IF_ERROR(Step(e.line));
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        List items;
        for (const auto& c : e.children) {
          ASSIGN_OR_RETURN(Value v, Eval(*c));
          items.push_back(std::move(v));
        }
        return Value::MakeList(std::move(items));
      }
      case Expr::Kind::kDict: {
        Dict items;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.children[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.children[i + 1]));
          if (!k.is_string()) return Error(e.line, "dict keys must be strings");
          bool replaced = false;
          for (auto& kv : items) {
            if (kv.first == k.str()) {
              kv.second = v;
              replaced = true;
            }
          }
          if (!replaced) items.emplace_back(k.str(), std::move(v));
        }
        return Value::MakeDict(std::move(items));
      }
      case Expr::Kind::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        return GetAttr(obj, e.name, e);
      }
      case Expr::Kind::kIndex: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.children[1]));
        return GetItem(obj, key, e);
      }
      case Expr::Kind::kSlice:
        return EvalSlice(e);
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(Value fn, Eval(*e.children[0]));
        Args args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalArgs(e, 1, &args, &kwargs));
        if (!fn.is_function()) {
          return Error(e.line, absl::StrCat("'", fn.TypeName(), "' object is not callable"));
        }
        auto result = fn.function()(args, kwargs);
        if (!result.ok() && !absl::StartsWith(result.status().message(), "template error")) {
          return absl::Status(
              result.status().code(),
              absl::StrCat("template error, line ", e.line, ": ", result.status().message()));
        }
        return result;
      }
      case Expr::Kind::kFilter:
        return EvalFilter(e);
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
        Args args;
        Kwargs kwargs;
        RETURN_IF_ERROR(EvalArgs(e, 1, &args, &kwargs));
        ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, v, args, e.line));
        return Value::Bool(result != e.negated);
      }
      case Expr::Kind::kUnary: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (!v.is_number()) {
          return Error(e.line, absl::StrCat("bad operand type for unary ", e.name, ": '",
                                            v.TypeName(), "'"));
        }
        if (e.name == "+") return v;
        return v.kind() == Value::Kind::kInt ? Value::Int(-v.int_value())
                                             : Value::Float(-v.number());
      }
      case Expr::Kind::kAnd: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        if (!a.Truthy()) return a;
        return Eval(*e.children[1]);
      }
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
        if (a.Truthy()) return a;
        return Eval(*e.children[1]);
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value cond, Eval(*e.children[1]));
        if (cond.Truthy()) return Eval(*e.children[0]);
        if (e.children[2] == nullptr) return Value();
        return Eval(*e.children[2]);
      }
      case Expr::Kind::kBinary:
        return EvalBinary(e);
    }
    return Value();
  }

  absl::Status EvalArgs(const Expr& e, size_t first, Args* args, Kwargs* kwargs) {
    const size_t positional = e.children.size() - e.kwarg_names.size();
    for (size_t i = first; i < e.children.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.children[i]));
      if (i < positional) {
        args->push_back(std::move(v));
      } else {
        kwargs->emplace_back(e.kwarg_names[i - positional], std::move(v));
      }
    }
    return absl::OkStatus();
  }

  absl::Status UndefinedError(const Value& obj, const Expr& e, absl::string_view what) {
    (void)obj;
    const Expr& base = *e.children[0];
    const std::string name =
        base.kind == Expr::Kind::kName ? absl::StrCat("'", base.name, "'") : std::string("value");
    return Error(e.line, absl::StrCat(name, " is undefined (accessing ", what, ")"));
  }

  absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name, const Expr& e) {
    if (obj.is_undefined()) return UndefinedError(obj, e, absl::StrCat("'", name, "'"));
    if (obj.is_string()) return StringMethod(obj, name, e.line);
    if (obj.is_dict()) {
      if (!obj.is_namespace() &&
          (name == "items" || name == "keys" || name == "values" || name == "get")) {
        return DictMethod(obj, name);
      }
      const Value* v = obj.Find(name);
      return v != nullptr ? *v : Value();
    }
    return Value();
  }

  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, const Expr& e) {
    if (obj.is_undefined()) return UndefinedError(obj, e, "an item");
    if (obj.is_dict()) {
      if (!key.is_string()) return Value();
      const Value* v = obj.Find(key.str());
      return v != nullptr ? *v : Value();
    }
    if (obj.is_list() || obj.is_string()) {
      if (key.kind() != Value::Kind::kInt) {
        if (obj.is_string() && key.is_string()) return StringMethod(obj, key.str(), e.line);
        return Error(e.line, absl::StrCat("indices must be integers, not ", key.TypeName()));
      }
      if (obj.is_string()) {
        ASSIGN_OR_RETURN(List chars, Iterate(obj, e.line));
        int64_t i = key.int_value();
        if (i < 0) i += static_cast<int64_t>(chars.size());
        if (i < 0 || i >= static_cast<int64_t>(chars.size())) return Value();
        return chars[i];
      }
      int64_t i = key.int_value();
      const int64_t n = static_cast<int64_t>(obj.list().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return obj.list()[i];
    }
    return Value();
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    ASSIGN_OR_RETURN(Value obj, Eval(*e.children[0]));
    int64_t bounds[3] = {0, 0, 1};
    bool present[3] = {false, false, false};
    for (int k = 0; k < 3; ++k) {
      if (e.children[k + 1] == nullptr) continue;
      ASSIGN_OR_RETURN(Value v, Eval(*e.children[k + 1]));
      if (v.is_none()) continue;
      if (v.kind() != Value::Kind::kInt) return Error(e.line, "slice indices must be integers");
      bounds[k] = v.int_value();
      present[k] = true;
    }
    List items;
    if (obj.is_list()) {
      items = obj.list();
    } else if (obj.is_string()) {
      ASSIGN_OR_RETURN(items, Iterate(obj, e.line));
    } else {
      return Error(e.line, absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
    }
    const int64_t n = static_cast<int64_t>(items.size());
    const int64_t step = bounds[2];
    if (step == 0) return Error(e.line, "slice step cannot be zero");
    auto clamp = [&](int64_t v, bool is_present, int64_t fallback) {
      if (!is_present) return fallback;
      if (v < 0) v += n;
      if (step > 0) return std::max<int64_t>(0, std::min(v, n));
      return std::max<int64_t>(-1, std::min(v, n - 1));
    };
    const int64_t start = clamp(bounds[0], present[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], present[1], step > 0 ? n : -1);
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(items[i]);
    if (obj.is_list()) return Value::MakeList(std::move(out));
    Value s = Value::String("");
    for (const Value& c : out) s = Concat(s, c);
    return s;
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    ASSIGN_OR_RETURN(Value a, Eval(*e.children[0]));
    ASSIGN_OR_RETURN(Value b, Eval(*e.children[1]));
    const std::string& op = e.name;
    if (op == "==") return Value::Bool(a == b);
    if (op == "!=") return Value::Bool(a != b);
    if (op == "~") return Concat(a.ToStringValue(), b.ToStringValue());
    if (op == "in" || op == "not in") {
      ASSIGN_OR_RETURN(bool found, Contains(b, a, e.line));
      return Value::Bool(found == (op == "in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int cmp;
      if (a.is_number() && b.is_number()) {
        cmp = a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
      } else if (a.is_string() && b.is_string()) {
        cmp = a.str().compare(b.str());
      } else {
        return Error(e.line, absl::StrCat("'", op, "' not supported between '", a.TypeName(),
                                          "' and '", b.TypeName(), "'"));
      }
      const bool r = op == "<" ? cmp < 0 : op == ">" ? cmp > 0 : op == "<=" ? cmp <= 0 : cmp >= 0;
      return Value::Bool(r);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Concat(a, b);
      if (a.is_list() && b.is_list()) {
        List items = a.list();
        items.insert(items.end(), b.list().begin(), b.list().end());
        return Value::MakeList(std::move(items));
      }
    }
    if (op == "*" && ((a.is_string() && b.kind() == Value::Kind::kInt) ||
                      (b.is_string() && a.kind() == Value::Kind::kInt))) {
      const Value& s = a.is_string() ? a : b;
      const int64_t times = a.is_string() ? b.int_value() : a.int_value();
      if (times * static_cast<int64_t>(s.str().size()) >
          static_cast<int64_t>(limits_.max_output_bytes)) {
        return absl::ResourceExhaustedError(
            absl::StrCat("template error, line ", e.line, ": string repetition too large"));
      }
      Value out = Value::String("");
      for (int64_t i = 0; i < times; ++i) out = Concat(out, s);
      return out;
    }
    if (!a.is_number() || !b.is_number()) {
      return Error(e.line, absl::StrCat("unsupported operand types for ", op, ": '", a.TypeName(),
                                        "' and '", b.TypeName(), "'"));
    }
    const bool ints = a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt;
    if (op == "+")
      return ints ? Value::Int(a.int_value() + b.int_value())
                  : Value::Float(a.number() + b.number());
    if (op == "-")
      return ints ? Value::Int(a.int_value() - b.int_value())
                  : Value::Float(a.number() - b.number());
    if (op == "*")
      return ints ? Value::Int(a.int_value() * b.int_value())
                  : Value::Float(a.number() * b.number());
    if (op == "/") {
      if (b.number() == 0) return Error(e.line, "division by zero");
      return Value::Float(a.number() / b.number());
    }
    if (op == "//" || op == "%") {
      if (b.number() == 0) return Error(e.line, "integer division or modulo by zero");
      if (ints) {
        int64_t q = a.int_value() / b.int_value(), r = a.int_value() % b.int_value();
        if (r != 0 && ((r < 0) != (b.int_value() < 0))) {
          --q;
          r += b.int_value();
        }
        return op == "//" ? Value::Int(q) : Value::Int(r);
      }
      const double q = std::floor(a.number() / b.number());
      return op == "//" ? Value::Float(q) : Value::Float(a.number() - q * b.number());
    }
    if (op == "**") {
      if (ints && b.int_value() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.int_value() && i < 64; ++i) r *= a.int_value();
        return Value::Int(r);
      }
      return Value::Float(std::pow(a.number(), b.number()));
    }
    return Error(e.line, absl::StrCat("unknown operator ", op));
  }

  // ---- filters ----

  absl::StatusOr<Value> EvalFilter(const Expr& e) {
    ASSIGN_OR_RETURN(Value v, Eval(*e.children[0]));
    Args args;
    Kwargs kwargs;
    RETURN_IF_ERROR(EvalArgs(e, 1, &args, &kwargs));
    return ApplyFilter(e.name, v, args, kwargs, e.line);
  }

  const RenderLimits& limits_;
  int64_t steps_ = 0;
  int depth_ = 0;
  std::vector<std::map<std::string, Value>> scopes_;
  std::vector<Rendered> outputs_;  // the top one receives output (set blocks and macros capture)
};

}  // namespace

absl::StatusOr<Rendered> RenderTree(const Node& root, const std::map<std::string, Value>& context,
                                    const RenderLimits& limits) {
  Renderer renderer(context, limits);
  return renderer.Run(root);
}

}  // namespace ferry::jinja
