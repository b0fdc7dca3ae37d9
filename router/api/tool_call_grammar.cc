#include "router/api/tool_call_grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/common/status.h"
#include "engine/grammar/gbnf_text.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using grammar::GbnfLiteral;

// The markers each parser reads (tool_call_parser.h; tool_call_parser_internal.h for DeepSeek's).
constexpr absl::string_view kHermesOpen = "<tool_call>";
constexpr absl::string_view kHermesClose = "</tool_call>";
constexpr absl::string_view kPythonTag = "<|python_tag|>";
constexpr absl::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr absl::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr absl::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr absl::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr absl::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr absl::string_view kDsSep = "<｜tool▁sep｜>";
constexpr size_t kMaxDsName = 256;  // the DeepSeek parser's longest call head

// A tool the grammar may call, and the rule its arguments follow.
struct Callable {
  size_t index;  // in `tools`
  std::string args_rule;
};

// The JSON string literal of `text`, as a canonical encoder writes it (no escapes but the needed
// ones, non-ASCII as itself).
std::string JsonString(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

class Builder {
 public:
  Builder(const std::vector<ApiTool>& tools, const ToolCallGrammarOptions& options)
      : tools_(tools), options_(options) {}

  absl::StatusOr<std::string> Build(const ApiToolChoice& choice) {
    const bool required = choice.mode != ApiToolChoice::Mode::kAuto;
    const bool one_call = choice.mode == ApiToolChoice::Mode::kFunction || !options_.parallel;
    std::vector<Callable> callables;
    for (size_t i = 0; i < tools_.size(); ++i) {
      if (choice.mode == ApiToolChoice::Mode::kFunction && tools_[i].name != choice.function) {
        continue;
      }
      // Strict tools' schemas are enforced, or the request refused; required and named calls
      // also follow a non-strict tool's schema where it compiles (best effort, as the API
      // promises for non-strict tools: any JSON object where it does not); in auto mode a
      // non-strict tool's arguments are any JSON object.
      const bool strict = tools_[i].strict.value_or(false);
      std::string args_rule;
      if (strict) {
        ASSIGN_OR_RETURN(args_rule, ArgumentsRule(i));
      } else if (required) {
        absl::StatusOr<std::string> rule = ArgumentsRule(i);
        if (rule.ok()) {
          args_rule = *std::move(rule);
        } else {
          ASSIGN_OR_RETURN(args_rule, AnyObjectRule());
        }
      } else {
        ASSIGN_OR_RETURN(args_rule, AnyObjectRule());
      }
      callables.push_back({i, std::move(args_rule)});
    }
    if (callables.empty()) {
      if (choice.mode == ApiToolChoice::Mode::kFunction) {
        return absl::InvalidArgumentError(absl::StrCat("tool_choice: function '", choice.function,
                                                       "' is not one of ", options_.tools_param));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("tool_choice 'required' needs at least one of ", options_.tools_param));
    }
    ASSIGN_OR_RETURN(const std::string root, Root(callables, required, one_call));
    std::string gbnf = absl::StrCat("root ::= ", root, "\n", rules_);
    if (gbnf.size() > options_.schema.max_grammar_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar of ", options_.tools_param, " (",
                                                     gbnf.size(), " bytes) exceeds the limit of ",
                                                     options_.schema.max_grammar_bytes, " bytes"));
    }
    return gbnf;
  }

 private:
  // The root rule's body, in the format's syntax.
  absl::StatusOr<std::string> Root(const std::vector<Callable>& callables, bool required,
                                   bool one_call) {
    switch (options_.format) {
      case ToolCallFormat::kHermes:
        return Hermes(callables, required, one_call);
      case ToolCallFormat::kLlama3Json:
        return Llama3(callables, required, one_call);
      case ToolCallFormat::kMistral:
        return Mistral(callables, required, one_call);
      case ToolCallFormat::kDeepSeek:
        return DeepSeek(callables, required, one_call);
    }
    return absl::InvalidArgumentError("unknown tool-call format");
  }

  std::string Param(size_t i, absl::string_view field) const {
    return absl::StrCat(options_.tools_param, "[", i, "].function.", field);
  }

  // Whitespace between the tokens of a call's own JSON object: none (compact) or the schema
  // options' bounded run.
  std::string W() {
    if (options_.schema.whitespace == grammar::JsonWhitespace::kCompact) return " ";
    if (!ws_defined_) {
      absl::StrAppend(&rules_, "ws ::= [ \\t\\n]{0,", options_.schema.max_whitespace, "}\n");
      ws_defined_ = true;
    }
    return " ws ";
  }

  // Tool i's `parameters`, compiled into rules prefixed "t<i>-"; returns the arguments' rule.
  absl::StatusOr<std::string> ArgumentsRule(size_t i) {
    nlohmann::ordered_json schema = tools_[i].parameters;
    if (!schema.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Param(i, "parameters"), ": must be a JSON Schema object"));
    }
    // The arguments are a JSON object: a schema that says nothing of its type is given that
    // type; one that allows others is refused (a parser would not read them as arguments).
    if (!schema.contains("type")) {
      schema["type"] = "object";
    } else if (schema["type"] != "object") {
      return absl::InvalidArgumentError(absl::StrCat(Param(i, "parameters"),
                                                     ": the arguments must be an object (type ",
                                                     schema["type"].dump(), ")"));
    }
    absl::StatusOr<std::string> gbnf = grammar::JsonSchemaToGbnf(schema, options_.schema);
    if (!gbnf.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Param(i, "parameters"), ": ", gbnf.status().message()));
    }
    const std::string prefix = absl::StrCat("t", i, "-");
    rules_ += grammar::PrefixGbnfRules(*gbnf, prefix);
    return prefix + "root";
  }

  // Any JSON object (a non-strict tool's arguments in auto mode), defined once.
  absl::StatusOr<std::string> AnyObjectRule() {
    if (!any_object_defined_) {
      nlohmann::ordered_json schema = {{"type", "object"}, {"additionalProperties", true}};
      ASSIGN_OR_RETURN(std::string gbnf, grammar::JsonSchemaToGbnf(schema, options_.schema));
      rules_ += grammar::PrefixGbnfRules(gbnf, "obj-");
      any_object_defined_ = true;
    }
    return std::string("obj-root");
  }

  // The JSON call object {"name":NAME,"<args_key>":ARGS} of each callable, as alternatives.
  absl::StatusOr<std::string> CallObjects(const std::vector<Callable>& callables,
                                          absl::string_view args_key) {
    std::vector<std::string> alternatives;
    for (const Callable& c : callables) {
      const std::string& name = tools_[c.index].name;
      if (name.empty()) return absl::InvalidArgumentError(Param(c.index, "name: is empty"));
      const std::string w = W();
      if (w == " ") {
        alternatives.push_back(absl::StrCat(
            GbnfLiteral("{\"name\":" + JsonString(name) + ",\"" + std::string(args_key) + "\":"),
            " ", c.args_rule, " \"}\""));
      } else {
        alternatives.push_back(absl::StrCat("\"{\"", w, GbnfLiteral("\"name\""), w, "\":\"", w,
                                            GbnfLiteral(JsonString(name)), w, "\",\"", w,
                                            GbnfLiteral(absl::StrCat("\"", args_key, "\"")), w,
                                            "\":\"", w, c.args_rule, w, "\"}\""));
      }
    }
    return Define("call-object", absl::StrJoin(alternatives, " | "));
  }

  std::string Define(const std::string& name, absl::string_view body) {
    absl::StrAppend(&rules_, name, " ::= ", body, "\n");
    return name;
  }

  // Hermes / Qwen: "<tool_call>\n{...}\n</tool_call>" per call, calls joined by "\n"
  // (chatml_tools.jinja renders them so).
  absl::StatusOr<std::string> Hermes(const std::vector<Callable>& callables, bool required,
                                     bool one_call) {
    ASSIGN_OR_RETURN(std::string object, CallObjects(callables, "arguments"));
    // What follows the open marker.
    const std::string body = Define(
        "call-body",
        absl::StrCat("\"\\n\" ", object, " ", GbnfLiteral("\n"), " ", GbnfLiteral(kHermesClose)));
    const std::string more =
        one_call
            ? ""
            : absl::StrCat(" (", GbnfLiteral(absl::StrCat("\n", kHermesOpen)), " ", body, ")*");
    const std::string calls_after_open = Define("calls-after-open", body + more);
    return Opened(kHermesOpen, {}, calls_after_open, required);
  }

  // Mistral v0.3: "[TOOL_CALLS] [" calls joined by ", " "]" (mistral.jinja).
  absl::StatusOr<std::string> Mistral(const std::vector<Callable>& callables, bool required,
                                      bool one_call) {
    ASSIGN_OR_RETURN(std::string object, CallObjects(callables, "arguments"));
    const std::string more = one_call ? "" : absl::StrCat(" (\", \" ", object, ")*");
    const std::string calls_after_open =
        Define("calls-after-open", absl::StrCat("\" [\" ", object, more, " \"]\""));
    return Opened(kMistralOpen, {}, calls_after_open, required);
  }

  // DeepSeek V3 / R1 ("function<sep>NAME\n```json\nARGS\n```"), or V3.1's head ("NAME<sep>ARGS"):
  // the model writes the one it was trained on. Calls joined by "\n" (V3) or nothing (V3.1).
  absl::StatusOr<std::string> DeepSeek(const std::vector<Callable>& callables, bool required,
                                       bool one_call) {
    std::vector<std::string> alternatives;
    for (const Callable& c : callables) {
      const std::string& name = tools_[c.index].name;
      // The parser reads the name up to the first of "\n`<", trimmed, at most 256 bytes.
      if (name.empty() || name.size() > kMaxDsName ||
          name.find_first_of("\n`<") != std::string::npos ||
          absl::StripAsciiWhitespace(name) != name) {
        return absl::InvalidArgumentError(
            absl::StrCat(Param(c.index, "name"), ": '", name,
                         "' cannot be written in deepseek's tool-call syntax (empty, over ",
                         kMaxDsName, " bytes, with a newline, '`' or '<', or spaces around)"));
      }
      alternatives.push_back(absl::StrCat(
          GbnfLiteral(absl::StrCat(kDsCallBegin, "function", kDsSep, name, "\n```json\n")), " ",
          c.args_rule, " ", GbnfLiteral(absl::StrCat("\n```", kDsCallEnd))));
      // A V3.1 head naming "function" reads as V3's.
      if (name != "function") {
        alternatives.push_back(absl::StrCat(GbnfLiteral(absl::StrCat(kDsCallBegin, name, kDsSep)),
                                            " ", c.args_rule, " ", GbnfLiteral(kDsCallEnd)));
      }
    }
    const std::string call = Define("call", absl::StrJoin(alternatives, " | "));
    const std::string more = one_call ? "" : absl::StrCat(" (\"\\n\"? ", call, ")*");
    const std::string calls_after_open =
        Define("calls-after-open", absl::StrCat(call, more, " ", GbnfLiteral(kDsCallsEnd)));
    // The parser also opens calls at a bare call begin marker: free text holds neither.
    return Opened(kDsCallsBegin, {std::string(kDsCallBegin)}, calls_after_open, required);
  }

  // A format whose calls follow an open marker the parser looks for anywhere in the text
  // (besides `others`, which free text must not hold either): the calls alone (required), or
  // free text, or free text up to the marker and the calls (auto).
  std::string Opened(absl::string_view open, const std::vector<std::string>& others,
                     const std::string& calls_after_open, bool required) {
    if (required) return absl::StrCat(GbnfLiteral(open), " ", calls_after_open);
    std::vector<std::string> all = others;
    all.insert(all.begin(), std::string(open));
    rules_ += grammar::GbnfTextWithoutAnyRules("free", all);
    rules_ += grammar::GbnfTextUntilRules("free-until-open", open, others);
    return absl::StrCat("free | free-until-open ", calls_after_open);
  }

  // Llama 3.1-3.3: the reply is the calls ({"name": ..., "parameters": ...}, joined by "; " as
  // vLLM's parser splits them), maybe after <|python_tag|>; a reply that does not begin with a
  // call is content (auto).
  absl::StatusOr<std::string> Llama3(const std::vector<Callable>& callables, bool required,
                                     bool one_call) {
    ASSIGN_OR_RETURN(std::string object, CallObjects(callables, "parameters"));
    const std::string more = one_call ? "" : absl::StrCat(" (\"; \" ", object, ")*");
    const std::string calls =
        Define("calls", absl::StrCat(GbnfLiteral(kPythonTag), "? ", object, more));
    if (required) return calls;
    // Content: the parser takes the reply as a call when its first non-space character is '{'
    // or it begins with <|python_tag|> (after spaces); any other reply is content.
    Define("any-char", "[\\x00-\\x7F] | [^\\x00-\\x7F]");
    const std::string tag_rest(kPythonTag.substr(1));  // after its '<'
    // not-tag-j: text after "<" + tag_rest[0, j) that does not go on with the rest of the tag.
    for (size_t j = 0; j < tag_rest.size(); ++j) {
      const uint32_t c = static_cast<unsigned char>(tag_rest[j]);
      absl::StrAppend(&rules_, "not-tag-", j, " ::= \"\" | [^",
                      grammar::GbnfClass({{c, c}}).substr(1), " any-char*");
      if (j + 1 < tag_rest.size()) {
        absl::StrAppend(&rules_, " | ", grammar::GbnfCodePointLiteral(c), " not-tag-", j + 1);
      }
      rules_ += "\n";
    }
    Define("free", "[ \\t\\r\\n]* ([^{< \\t\\r\\n] any-char* | \"<\" not-tag-0)?");
    return absl::StrCat("free | ", calls);
  }

  const std::vector<ApiTool>& tools_;
  const ToolCallGrammarOptions& options_;
  std::string rules_;  // every rule but root
  bool ws_defined_ = false;
  bool any_object_defined_ = false;
};

}  // namespace

absl::StatusOr<std::string> ToolCallGrammar(const std::vector<ApiTool>& tools,
                                            const ApiToolChoice& choice,
                                            const ToolCallGrammarOptions& options) {
  switch (choice.mode) {
    case ApiToolChoice::Mode::kNone:
      return std::string();
    case ApiToolChoice::Mode::kAuto: {
      bool any_strict = false;
      for (const ApiTool& t : tools) any_strict = any_strict || t.strict.value_or(false);
      if (!any_strict) return std::string();
      break;
    }
    case ApiToolChoice::Mode::kRequired:
    case ApiToolChoice::Mode::kFunction:
      break;
  }
  Builder builder(tools, options);
  return builder.Build(choice);
}

}  // namespace ferry
