#include "router/api/output_constraint.h"

#include <memory>
#include <optional>
#include <string>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

// Whether the lowered grammar accepts exactly `text` (every byte, and complete at its end).
bool Accepts(const LoweredConstraint& c, const std::string& text) {
  absl::StatusOr<grammar::Grammar> g = grammar::ParseGbnf(c.grammar);
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return false;
  auto m = grammar::GrammarMatcher::Create(std::make_shared<grammar::Grammar>(*std::move(g)));
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return false;
  return m->AdvanceBytes(text) == grammar::GrammarMatcher::Step::kOk && m->Accepting();
}

ApiRequest Chat(ApiOutputFormat::Kind kind, const std::string& param) {
  ApiRequest r;
  r.kind = ApiKind::kChatCompletion;
  r.output_format.kind = kind;
  r.output_format.param = param;
  return r;
}

LoweredConstraint Lower(const ApiRequest& r, const ConstraintSetup& setup = {}) {
  std::optional<LoweredConstraint> c;
  const ApiError e = LowerOutputConstraint(r, setup, &c);
  EXPECT_TRUE(e.status.ok()) << e.status;
  EXPECT_TRUE(c.has_value());
  return c.value_or(LoweredConstraint{});
}

ApiError LowerError(const ApiRequest& r, const ConstraintSetup& setup = {}) {
  std::optional<LoweredConstraint> c;
  const ApiError e = LowerOutputConstraint(r, setup, &c);
  EXPECT_FALSE(c.has_value());
  return e;
}

TEST(OutputConstraintTest, NoFormatNoConstraint) {
  std::optional<LoweredConstraint> c;
  ApiRequest r;
  ASSERT_TRUE(LowerOutputConstraint(r, {}, &c).status.ok());
  EXPECT_FALSE(c.has_value());
}

TEST(OutputConstraintTest, JsonSchemaIsCompactInPropertyOrderWithoutExtraProperties) {
  ApiRequest r = Chat(ApiOutputFormat::Kind::kJsonSchema, "response_format.json_schema.schema");
  r.output_format.schema = Json::parse(
      R"({"type":"object","properties":{"b":{"type":"integer"},"a":{"enum":["x","y"]}},
          "required":["b"]})");
  const LoweredConstraint c = Lower(r);
  EXPECT_EQ(c.kind, ConstraintKind::kJsonSchema);
  EXPECT_EQ(c.hash, Xxh3Hash128(c.grammar));
  EXPECT_TRUE(Accepts(c, R"({"b":12})"));
  EXPECT_TRUE(Accepts(c, R"({"b":-3,"a":"y"})"));
  EXPECT_FALSE(Accepts(c, R"({"a":"y","b":-3})"));  // the schema's order
  EXPECT_FALSE(Accepts(c, R"({"b": 12})"));         // compact
  EXPECT_FALSE(Accepts(c, R"({"b":1.5})"));
  EXPECT_FALSE(Accepts(c, R"({"b":1,"c":2})"));
  EXPECT_FALSE(Accepts(c, R"({"a":"x"})"));  // b is required
}

TEST(OutputConstraintTest, JsonObjectIsAnyObject) {
  const LoweredConstraint c = Lower(Chat(ApiOutputFormat::Kind::kJsonObject, "response_format"));
  EXPECT_EQ(c.kind, ConstraintKind::kJsonObject);
  EXPECT_TRUE(Accepts(c, R"({"k":[1,{"x":null}],"s":"\u00e9\n"})"));
  EXPECT_TRUE(Accepts(c, R"({})"));
  EXPECT_FALSE(Accepts(c, R"([1])"));
  EXPECT_FALSE(Accepts(c, R"("s")"));
}

TEST(OutputConstraintTest, RegexChoiceAndGrammar) {
  ApiRequest r = Chat(ApiOutputFormat::Kind::kRegex, "structured_outputs.regex");
  r.output_format.text = "[0-9]{3}-(ab|c)+";
  LoweredConstraint c = Lower(r);
  EXPECT_EQ(c.kind, ConstraintKind::kRegex);
  EXPECT_TRUE(Accepts(c, "123-abcab"));
  EXPECT_FALSE(Accepts(c, "12-ab"));
  EXPECT_FALSE(Accepts(c, "123-"));

  r = Chat(ApiOutputFormat::Kind::kChoice, "structured_outputs.choice");
  r.output_format.choices = {"yes", "no", "\"quoted\" \\ back"};
  c = Lower(r);
  EXPECT_EQ(c.kind, ConstraintKind::kChoice);
  EXPECT_TRUE(Accepts(c, "yes"));
  EXPECT_TRUE(Accepts(c, "no"));
  EXPECT_TRUE(Accepts(c, "\"quoted\" \\ back"));
  EXPECT_FALSE(Accepts(c, "ye"));
  EXPECT_FALSE(Accepts(c, "yesno"));

  r = Chat(ApiOutputFormat::Kind::kGrammar, "structured_outputs.grammar");
  r.output_format.text = "root ::= item (\",\" item)*\nitem ::= [a-z]+  # a word\n";
  c = Lower(r);
  EXPECT_EQ(c.kind, ConstraintKind::kGrammar);
  EXPECT_TRUE(Accepts(c, "ab,c,def"));
  EXPECT_FALSE(Accepts(c, "ab,"));
}

TEST(OutputConstraintTest, WhatCannotBeEnforcedIsA400NamingTheField) {
  ApiRequest r = Chat(ApiOutputFormat::Kind::kRegex, "structured_outputs.regex");
  r.output_format.text = "(a)\\1";
  ApiError e = LowerError(r);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.param, "structured_outputs.regex");
  EXPECT_NE(e.status.message().find("backreference"), std::string::npos) << e.status;

  r = Chat(ApiOutputFormat::Kind::kGrammar, "guided_grammar");
  r.output_format.text = "root ::= undefined-rule";
  e = LowerError(r);
  EXPECT_EQ(e.param, "guided_grammar");
  EXPECT_NE(e.status.message().find("undefined-rule"), std::string::npos) << e.status;

  r = Chat(ApiOutputFormat::Kind::kJsonSchema, "text.format.schema");
  r.output_format.schema = Json::parse(R"({"type":"object","patternProperties":{"a":{}}})");
  e = LowerError(r);
  EXPECT_EQ(e.param, "text.format.schema");
  EXPECT_NE(e.status.message().find("patternProperties"), std::string::npos) << e.status;

  // A grammar over the validating compile's limits.
  r = Chat(ApiOutputFormat::Kind::kGrammar, "structured_outputs.grammar");
  r.output_format.text = "root ::= \"" + std::string(2000, 'a') + "\"";
  ConstraintSetup small;
  small.gbnf.max_text_bytes = 1000;
  e = LowerError(r, small);
  EXPECT_EQ(e.param, "structured_outputs.grammar");

  // Forced tool calls on a model with no tool-call format.
  r = Chat(ApiOutputFormat::Kind::kText, "");
  r.tools.push_back(ApiTool{"f", "", Json::parse(R"({"type":"object"})"), std::nullopt});
  r.tool_choice.mode = ApiToolChoice::Mode::kRequired;
  ConstraintSetup no_format;
  no_format.tools_rendered = true;
  e = LowerError(r, no_format);
  EXPECT_EQ(e.param, "tool_choice");
}

TEST(OutputConstraintTest, ForcedToolCallsAndFormatOrCalls) {
  ApiRequest r = Chat(ApiOutputFormat::Kind::kText, "");
  r.tools.push_back(ApiTool{"get_weather", "", Json::parse(R"({"type":"object","properties":
      {"city":{"type":"string"}},"required":["city"],"additionalProperties":false})"),
                            true});
  r.tools.push_back(ApiTool{"get_time", "", Json::parse(R"({"type":"object"})"), std::nullopt});
  ConstraintSetup setup;
  setup.tool_format = ToolCallFormat::kHermes;
  setup.tools_rendered = true;
  const std::string weather =
      "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n"
      "</tool_call>";

  // Required: calls only.
  r.tool_choice.mode = ApiToolChoice::Mode::kRequired;
  LoweredConstraint c = Lower(r, setup);
  EXPECT_EQ(c.kind, ConstraintKind::kToolCalls);
  EXPECT_TRUE(Accepts(c, weather));
  EXPECT_FALSE(Accepts(c, "Sure! " + weather));
  EXPECT_FALSE(Accepts(c,
                       "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{}}\n"
                       "</tool_call>"));  // city is required

  // Named: that function only.
  r.tool_choice = {ApiToolChoice::Mode::kFunction, "get_time"};
  c = Lower(r, setup);
  EXPECT_FALSE(Accepts(c, weather));
  EXPECT_TRUE(Accepts(c,
                      "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{\"tz\":1}}\n"
                      "</tool_call>"));

  // A format with forced calls: the calls win.
  r.output_format.kind = ApiOutputFormat::Kind::kJsonObject;
  r.output_format.param = "response_format";
  r.tool_choice.mode = ApiToolChoice::Mode::kRequired;
  c = Lower(r, setup);
  EXPECT_EQ(c.kind, ConstraintKind::kToolCalls);
  EXPECT_FALSE(Accepts(c, R"({"a":1})"));

  // Auto with a format: the format, or calls.
  r.tool_choice.mode = ApiToolChoice::Mode::kAuto;
  c = Lower(r, setup);
  EXPECT_EQ(c.kind, ConstraintKind::kJsonObject);
  EXPECT_TRUE(Accepts(c, R"({"a":1})"));
  EXPECT_TRUE(Accepts(c, weather));
  EXPECT_FALSE(Accepts(c, "plain text"));

  // Auto, no format: text, or text then calls whose strict tools obey their schemas.
  r.output_format = ApiOutputFormat();
  c = Lower(r, setup);
  EXPECT_EQ(c.kind, ConstraintKind::kToolCalls);
  EXPECT_TRUE(Accepts(c, "plain text"));
  EXPECT_TRUE(Accepts(c, "Let me look.\n" + weather));

  // Tool choice none, or tools not shown: nothing to constrain.
  r.tool_choice.mode = ApiToolChoice::Mode::kNone;
  std::optional<LoweredConstraint> none;
  ASSERT_TRUE(LowerOutputConstraint(r, setup, &none).status.ok());
  EXPECT_FALSE(none.has_value());
}

TEST(OutputConstraintTest, AfterTheReasoningBlock) {
  ApiRequest r = Chat(ApiOutputFormat::Kind::kJsonSchema, "response_format.json_schema.schema");
  r.output_format.schema = Json::parse(R"({"type":"object","properties":{"a":{"type":"integer"}},
                                          "required":["a"]})");
  ConstraintSetup setup;
  setup.reasoning = true;
  LoweredConstraint c = Lower(r, setup);
  EXPECT_TRUE(Accepts(c, R"({"a":1})"));  // no block at all
  EXPECT_TRUE(
      Accepts(c, "<think>\nLet me see: {\"a\": x} </thin k> <think>\n</think>\n\n{\"a\":1}"));
  EXPECT_TRUE(Accepts(c, " \n<think></think>{\"a\":1}"));
  EXPECT_FALSE(
      Accepts(c, "<think>x</think></think>{\"a\":1}"));  // the block ends at its first close
  EXPECT_FALSE(Accepts(c, "<think>x</think>\nsure: {\"a\":1}"));
  EXPECT_FALSE(Accepts(c, "<think>never closed {\"a\":1}"));
  EXPECT_FALSE(Accepts(c, "preamble <think>x</think>{\"a\":1}"));

  // The prompt opened the block: the reply starts inside it.
  setup.reasoning_started = true;
  c = Lower(r, setup);
  EXPECT_TRUE(Accepts(c, "step 1 <think> still </think>\n{\"a\":7}"));
  EXPECT_FALSE(Accepts(c, R"({"a":7})"));

  // Completions have no reasoning parser: the constraint starts at once.
  r.kind = ApiKind::kCompletion;
  c = Lower(r, setup);
  EXPECT_TRUE(Accepts(c, R"({"a":7})"));
  EXPECT_FALSE(Accepts(c, "</think>{\"a\":7}"));
}

}  // namespace
}  // namespace ferry
