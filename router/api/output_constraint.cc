#include "router/api/output_constraint.h"

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/grammar/gbnf_text.h"
#include "engine/grammar/regex_to_gbnf.h"
#include "router/api/reasoning_parser.h"
#include "router/api/request_json.h"
#include "router/api/tool_call_grammar.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

ApiError Refused(const std::string& param, const absl::Status& status) {
  return ApiInvalid(param, absl::StrCat("'", param, "' cannot be enforced: ", status.message()));
}

// The output format's grammar (`root ::= ...`), or a 400 naming its field.
ApiError FormatGrammar(const ApiOutputFormat& format, const ConstraintSetup& setup,
                       std::string* out) {
  switch (format.kind) {
    case ApiOutputFormat::Kind::kText:
      return ApiOk();
    case ApiOutputFormat::Kind::kJsonObject: {
      grammar::JsonSchemaOptions options = setup.schema;
      options.additional_properties_by_default = true;
      absl::StatusOr<std::string> g = grammar::JsonSchemaToGbnf(Json{{"type", "object"}}, options);
      if (!g.ok()) return Refused(format.param, g.status());
      *out = *std::move(g);
      return ApiOk();
    }
    case ApiOutputFormat::Kind::kJsonSchema: {
      absl::StatusOr<std::string> g = grammar::JsonSchemaToGbnf(format.schema, setup.schema);
      if (!g.ok()) return Refused(format.param, g.status());
      *out = *std::move(g);
      return ApiOk();
    }
    case ApiOutputFormat::Kind::kRegex: {
      absl::StatusOr<std::string> g = grammar::RegexToGbnf(format.text, setup.schema.regex);
      if (!g.ok()) return Refused(format.param, g.status());
      *out = *std::move(g);
      return ApiOk();
    }
    case ApiOutputFormat::Kind::kGrammar:
      *out = format.text;
      return ApiOk();
    case ApiOutputFormat::Kind::kChoice: {
      std::string g = "root ::= ";
      for (size_t i = 0; i < format.choices.size(); ++i) {
        if (i > 0) g.append(" | ");
        g.append(grammar::GbnfLiteral(format.choices[i]));
      }
      g.push_back('\n');
      *out = std::move(g);
      return ApiOk();
    }
  }
  return ApiOk();
}

ConstraintKind KindOf(ApiOutputFormat::Kind kind) {
  switch (kind) {
    case ApiOutputFormat::Kind::kJsonObject:
      return ConstraintKind::kJsonObject;
    case ApiOutputFormat::Kind::kRegex:
      return ConstraintKind::kRegex;
    case ApiOutputFormat::Kind::kGrammar:
      return ConstraintKind::kGrammar;
    case ApiOutputFormat::Kind::kChoice:
      return ConstraintKind::kChoice;
    default:
      return ConstraintKind::kJsonSchema;
  }
}

// The tool calls' grammar for `choice` ("" when it constrains nothing), or a 400.
ApiError ToolsGrammar(const ApiRequest& request, const ApiToolChoice& choice,
                      const ConstraintSetup& setup, std::string* out) {
  if (!setup.tool_format.has_value()) {
    return ApiInvalid("tool_choice",
                      "this model has no tool-call format, so tool calls cannot be enforced");
  }
  ToolCallGrammarOptions options;
  options.format = *setup.tool_format;
  options.parallel = request.parallel_tool_calls;
  options.schema = setup.schema;
  absl::StatusOr<std::string> g = ToolCallGrammar(request.tools, choice, options);
  if (!g.ok()) return Refused("tools", g.status());
  *out = *std::move(g);
  return ApiOk();
}

// `root ::= first | second` over the two grammars' rules, kept apart by prefixes.
std::string Either(const std::string& first, const std::string& second) {
  return absl::StrCat("root ::= a-root | b-root\n", grammar::PrefixGbnfRules(first, "a-"),
                      grammar::PrefixGbnfRules(second, "b-"));
}

// `body` after the reasoning block the reasoning parser reads (reasoning_parser.h).
std::string AfterReasoning(const std::string& body, bool started) {
  const std::string block_end = absl::StrCat(
      grammar::GbnfTextUntilRules("think-text", ReasoningParser::kClose), "think-nl ::= [\\n]*\n");
  const std::string root = started ? "root ::= think-text think-nl body-root\n"
                                   : absl::StrCat("root ::= ([ \\t\\n\\r]* ",
                                                  grammar::GbnfLiteral(ReasoningParser::kOpen),
                                                  " think-text think-nl)? body-root\n");
  return absl::StrCat(root, block_end, grammar::PrefixGbnfRules(body, "body-"));
}

}  // namespace

const char* ConstraintKindName(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonSchema:
      return "json_schema";
    case ConstraintKind::kJsonObject:
      return "json_object";
    case ConstraintKind::kRegex:
      return "regex";
    case ConstraintKind::kGrammar:
      return "grammar";
    case ConstraintKind::kChoice:
      return "choice";
    case ConstraintKind::kToolCalls:
      return "tool_calls";
  }
  return "unknown";
}

ApiError LowerOutputConstraint(const ApiRequest& request, const ConstraintSetup& setup,
                               std::optional<LoweredConstraint>* out) {
  out->reset();
  const ApiOutputFormat& format = request.output_format;
  const bool chat = request.kind != ApiKind::kCompletion;
  const bool tools = chat && setup.tools_rendered && !request.tools.empty();
  const ApiToolChoice::Mode mode = request.tool_choice.mode;
  LoweredConstraint c;
  if (tools && (mode == ApiToolChoice::Mode::kRequired || mode == ApiToolChoice::Mode::kFunction)) {
    RETURN_IF_API_ERROR(ToolsGrammar(request, request.tool_choice, setup, &c.grammar));
    c.kind = ConstraintKind::kToolCalls;
  } else if (tools && mode == ApiToolChoice::Mode::kAuto &&
             format.kind != ApiOutputFormat::Kind::kText) {
    std::string answer, calls;
    RETURN_IF_API_ERROR(FormatGrammar(format, setup, &answer));
    ApiToolChoice required;
    required.mode = ApiToolChoice::Mode::kRequired;
    RETURN_IF_API_ERROR(ToolsGrammar(request, required, setup, &calls));
    c.grammar = Either(answer, calls);
    c.kind = KindOf(format.kind);
  } else if (tools && mode == ApiToolChoice::Mode::kAuto) {
    // Strict tools only: "" when none is, and nothing is constrained.
    RETURN_IF_API_ERROR(ToolsGrammar(request, request.tool_choice, setup, &c.grammar));
    c.kind = ConstraintKind::kToolCalls;
  } else {
    RETURN_IF_API_ERROR(FormatGrammar(format, setup, &c.grammar));
    c.kind = KindOf(format.kind);
  }
  if (c.grammar.empty()) return ApiOk();
  if (chat && setup.reasoning) c.grammar = AfterReasoning(c.grammar, setup.reasoning_started);
  const std::string param =
      c.kind == ConstraintKind::kToolCalls ? std::string("tools") : format.param;
  if (absl::StatusOr<grammar::Grammar> g = grammar::ParseGbnf(c.grammar, setup.gbnf); !g.ok()) {
    return Refused(param, g.status());
  }
  c.hash = Xxh3Hash128(c.grammar);
  *out = std::move(c);
  return ApiOk();
}

}  // namespace ferry
