// The grammar of a reply that calls tools, in the syntax the model's tool-call parser reads
// (tool_call_parser.h), each call's arguments constrained by its tool's JSON Schema: what
// `tool_choice` "required" or a named function, and `strict` tools, lower to (issue 49,
// docs/design/grammar.md "Tool calls"). The text is GBNF with a `root` rule; the router's
// output constraint (output_constraint.h) may wrap it further (a reasoning block first).
//
// Modes:
//  - kRequired: one call or more (one exactly when !parallel), no text before the first
//    call; any of `tools`; nothing but the calls (and the format's separators) after.
//  - kFunction: exactly one call of `choice.function`.
//  - kAuto: free text, or free text then calls, where each call is one of `tools` and the
//    arguments of a `strict` tool obey its schema (a non-strict tool's arguments are any
//    JSON object). Returns "" when no tool is strict (nothing to constrain).
//  - kNone: "" (no constraint).
// Every string the grammar accepts, fed to the format's ToolCallParser, yields exactly the calls
// it spells (names and arguments), no content after the calls.
//
// A strict tool's schema is always enforced (one that does not compile is an error); in
// kRequired and kFunction a non-strict tool's schema is enforced where it compiles, and where it
// does not (a `format: "uri"`, say) its arguments are any JSON object, as the APIs promise
// non-strict tools only best effort; in kAuto a non-strict tool's arguments are any JSON object.
// The arguments are a JSON object: a schema without `type` is given "type": "object", one with
// another type is refused. Call objects are compact JSON (or bounded whitespace, as options.schema
// says); the framing is the format's own text (the syntax of each format and the free-text rules:
// docs/design/grammar.md, "Tool calls").
//
// Errors: InvalidArgument naming the tool ("tools[2].function.parameters: ...") when a schema
// the grammar must enforce does not compile (json_schema.h's subset and limits), or when the
// format cannot express the mode or a name (DeepSeek writes names raw: "tools[2].function.name:
// ..."); a named function that is not in `tools`, kRequired without tools, or a text over
// options.schema.max_grammar_bytes. Pure function; thread-safe.

#ifndef FERRY_ROUTER_API_TOOL_CALL_GRAMMAR_H_
#define FERRY_ROUTER_API_TOOL_CALL_GRAMMAR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/grammar/json_schema.h"
#include "router/api/conversation.h"
#include "router/api/tool_call_parser.h"

namespace ferry {

struct ToolCallGrammarOptions {
  ToolCallFormat format = ToolCallFormat::kHermes;
  bool parallel = true;  // parallel_tool_calls: more than one call allowed
  // How each tool's `parameters` compile (whitespace policy, limits).
  grammar::JsonSchemaOptions schema;
  // The API's name for the tools field in messages ("tools", Anthropic's "tools" too).
  std::string tools_param = "tools";
};

absl::StatusOr<std::string> ToolCallGrammar(const std::vector<ApiTool>& tools,
                                            const ApiToolChoice& choice,
                                            const ToolCallGrammarOptions& options);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_TOOL_CALL_GRAMMAR_H_
