// Structured output lowered to the one grammar the workers enforce (issue 49, docs/design/
// grammar.md "From the API to the worker"): a request's output format (api_request.h
// ApiOutputFormat: JSON Schema, any JSON object, regex, GBNF, choice) and the tool calls its
// `tool_choice` forces (tool_call_grammar.h) become one GBNF text with a kind and its hash, which
// travels in SamplingParams.constraint. The router compiles the text once (ParseGbnf) only to
// refuse what cannot be enforced with a 400 before any worker sees it; the worker compiles it for
// its vocabulary.
//
// The forms combine so:
//   - tool_choice "required" or a named function (the model was shown tools): the tool calls'
//     grammar; an output format applies to the answer after the calls, in a later turn, and is
//     not enforced in this one;
//   - tool_choice "auto" with tools shown: with an output format, that format or tool calls
//     (each call's arguments per tool_call_grammar.h); without one, tool_call_grammar.h's auto
//     mode (free text, then calls whose strict tools' arguments obey their schemas; nothing when
//     no tool is strict);
//   - otherwise the output format alone.
// With a reasoning parser (chat APIs) the constraint starts after the `<think>...</think>`
// block: the block may open the reply (or the prompt opened it), hold any text but its close
// marker, and be followed by newlines; then the constrained answer.
//
// Policies stated once: JSON is compact (no whitespace outside strings: a small model at
// temperature 1 pads free whitespace until `length`), properties in the schema's order, no
// properties beyond `properties` unless the schema allows them (json_schema.h); `json_object`
// is any JSON object.
//
// Pure function; thread-safe. Errors: a 400 (ApiError) naming the field whose schema, regex or
// grammar cannot be compiled within the limits, with the compiler's message.

#ifndef FERRY_ROUTER_API_OUTPUT_CONSTRAINT_H_
#define FERRY_ROUTER_API_OUTPUT_CONSTRAINT_H_

#include <optional>
#include <string>

#include "engine/common/hash128.h"
#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/json_schema.h"
#include "router/api/api_request.h"
#include "router/api/tool_call_parser.h"

namespace ferry {

// What a lowered constraint was written as (SamplingParams.constraint.kind).
enum class ConstraintKind { kJsonSchema, kJsonObject, kRegex, kGrammar, kChoice, kToolCalls };

struct LoweredConstraint {
  ConstraintKind kind = ConstraintKind::kJsonSchema;
  std::string grammar;  // GBNF, `root ::= ...`
  Hash128 hash;         // Xxh3Hash128(grammar)
};

// The model's side of the lowering: from the router's setup and the rendered prompt.
struct ConstraintSetup {
  std::optional<ToolCallFormat> tool_format;  // the syntax the model writes calls in
  bool tools_rendered = false;                // the prompt shows the model its tools
  bool reasoning = false;                     // a reasoning parser reads the reply
  bool reasoning_started = false;             // the prompt ends inside an open <think> block
  grammar::JsonSchemaOptions schema;          // whitespace policy and the schema limits
  grammar::GbnfLimits gbnf;                   // the validating compile's limits
};

// The request's constraint (nullopt: none) into `out`; the ApiError's status is OK on success.
ApiError LowerOutputConstraint(const ApiRequest& request, const ConstraintSetup& setup,
                               std::optional<LoweredConstraint>* out);

// "json_schema", "json_object", "regex", "grammar", "choice", "tool_calls" (metrics, logs).
const char* ConstraintKindName(ConstraintKind kind);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_OUTPUT_CONSTRAINT_H_
