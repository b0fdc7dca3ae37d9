// The syntax tree of a parsed template (private to engine/template: template.cc builds it,
// renderer.cc evaluates it).

#ifndef FERRY_ENGINE_TEMPLATE_SYNTAX_TREE_H_
#define FERRY_ENGINE_TEMPLATE_SYNTAX_TREE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/template/template.h"
#include "engine/template/value.h"

namespace ferry::jinja {

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // children
    kDict,     // children: key, value, key, value...
    kAttr,     // children[0] . name
    kIndex,    // children[0] [ children[1] ]
    kSlice,    // children[0] [ children[1] : children[2] : children[3] ] (null = absent)
    kCall,     // children[0] ( children[1..] ), kwarg_names for the trailing ones
    kFilter,   // children[0] | name ( children[1..] )
    kTest,     // children[0] is [not] name ( children[1..] )
    kUnary,    // op children[0]   ("-", "+", "not")
    kBinary,   // children[0] op children[1]
    kAnd,
    kOr,
    kCond,  // children[0] if children[1] else children[2] (null = undefined)
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // names, attributes, filters, tests, operators
  bool negated = false;
  std::vector<std::unique_ptr<Expr>> children;
  std::vector<std::string> kwarg_names;  // calls and filters: names of the last arguments
};

struct Node {
  enum class Kind {
    kSequence,
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue
  };
  Kind kind;
  int line = 0;
  std::string text;                           // kText; kSet/kSetBlock/kMacro target name
  std::string attribute;                      // kSet on a namespace: target.attribute
  std::vector<std::string> targets;           // kFor loop variables; kMacro parameter names
  std::vector<std::unique_ptr<Expr>> exprs;   // kOutput/kSet: [value]; kIf: conditions;
                                              // kFor: [iterable, filter?]; kMacro: defaults
  std::vector<std::unique_ptr<Node>> bodies;  // kSequence: items; kIf: branches (+else);
                                              // kFor: [body, else?]; kMacro/kSetBlock: [body]
  bool has_else = false;
};

absl::StatusOr<Rendered> RenderTree(const Node& root, const std::map<std::string, Value>& context,
                                    const RenderLimits& limits);

}  // namespace ferry::jinja

#endif  // FERRY_ENGINE_TEMPLATE_SYNTAX_TREE_H_
