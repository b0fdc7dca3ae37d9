// The Anthropic Messages adapter: the parser (what it takes and how it lands in the internal
// model: system blocks, tool_use / tool_result / thinking blocks, tools and tool_choice,
// cache_control and its ttl, sampling; and a table of what it refuses, each with the field it
// names), and the writer (a full body, a stream's events in order with their indexes and JSON,
// stop reasons, usage, errors).

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/api/anthropic_parser.h"
#include "router/api/anthropic_writer.h"
#include "router/api/request_json.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

ApiLimits Limits() {
  ApiLimits l;
  l.model = "tiny";
  l.vocab_size = 512;
  return l;
}

// A minimal valid body with `extra` (",\"key\":value..." or "") added.
std::string Body(const std::string& extra) {
  return R"({"model":"tiny","max_tokens":64,"messages":[{"role":"user","content":"Hi"}])" + extra +
         "}";
}

TEST(AnthropicParserTest, MessagesBecomeTheInternalModel) {
  ApiRequest r;
  const ApiError e = ParseAnthropicMessages(R"({
      "model": "tiny",
      "max_tokens": 2048,
      "system": [{"type": "text", "text": "You are terse. ", "cache_control": {"type": "ephemeral"}},
                 {"type": "text", "text": "Use tools."}],
      "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
          {"type": "thinking", "thinking": "I should look both up.", "signature": "sig"},
          {"type": "redacted_thinking", "data": "opaque"},
          {"type": "text", "text": "Looking."},
          {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
           "input": {"city": "Paris", "units": "c"}},
          {"type": "tool_use", "id": "toolu_02", "name": "get_weather", "input": {"city": "Rome"},
           "cache_control": {"type": "ephemeral", "ttl": "5m"}}]},
        {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_01", "content": "22 C"},
          {"type": "tool_result", "tool_use_id": "toolu_02", "is_error": false,
           "content": [{"type": "text", "text": "25 "}, {"type": "text", "text": "C"}]},
          {"type": "text", "text": "Which is warmer?"}]}],
      "tools": [{"name": "get_weather", "description": "Current weather",
                 "input_schema": {"type": "object",
                                  "properties": {"units": {"type": "string"},
                                                 "city": {"type": "string"}},
                                  "required": ["city"]},
                 "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
      "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
      "stop_sequences": ["END", "STOP"],
      "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stream": true,
      "metadata": {"user_id": "u-42"},
      "thinking": {"type": "enabled", "budget_tokens": 1024},
      "service_tier": "auto"})",
                                            Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  EXPECT_EQ(r.kind, ApiKind::kMessages);
  EXPECT_EQ(r.model, "tiny");
  ASSERT_EQ(r.messages.size(), 6u);
  // The system blocks: one leading system message, a part per block.
  EXPECT_EQ(r.messages[0].role, ApiRole::kSystem);
  ASSERT_EQ(r.messages[0].content.size(), 2u);
  EXPECT_EQ(r.messages[0].Text(), "You are terse. Use tools.");
  EXPECT_EQ(r.messages[1].role, ApiRole::kUser);
  EXPECT_EQ(r.messages[1].Text(), "Weather in Paris and Rome?");
  // The assistant: its text, reasoning (redacted thinking dropped) and calls.
  const ApiMessage& a = r.messages[2];
  EXPECT_EQ(a.role, ApiRole::kAssistant);
  EXPECT_EQ(a.Text(), "Looking.");
  EXPECT_EQ(a.reasoning, "I should look both up.");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "toolu_01");
  EXPECT_EQ(a.tool_calls[0].name, "get_weather");
  EXPECT_EQ(a.tool_calls[0].arguments, R"({"city":"Paris","units":"c"})");  // compact, in order
  EXPECT_EQ(a.tool_calls[1].arguments, R"({"city":"Rome"})");
  // The results, each a tool message, before the rest of their message.
  EXPECT_EQ(r.messages[3].role, ApiRole::kTool);
  EXPECT_EQ(r.messages[3].tool_call_id, "toolu_01");
  EXPECT_EQ(r.messages[3].Text(), "22 C");
  EXPECT_EQ(r.messages[4].role, ApiRole::kTool);
  EXPECT_EQ(r.messages[4].tool_call_id, "toolu_02");
  EXPECT_EQ(r.messages[4].Text(), "25 C");
  EXPECT_EQ(r.messages[5].role, ApiRole::kUser);
  EXPECT_EQ(r.messages[5].Text(), "Which is warmer?");
  // Tools: the schema as written (key order kept), the choice, parallelism.
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools[0].description, "Current weather");
  EXPECT_EQ(r.tools[0].parameters.dump(),
            R"({"type":"object","properties":{"units":{"type":"string"},"city":{"type":"string"}},)"
            R"("required":["city"]})");
  EXPECT_EQ(r.tool_choice.mode, ApiToolChoice::Mode::kFunction);
  EXPECT_EQ(r.tool_choice.function, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
  // Sampling and the rest.
  EXPECT_EQ(*r.sampling.max_tokens, 2048);
  EXPECT_EQ(r.sampling.stop, (std::vector<std::string>{"END", "STOP"}));
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.user, "u-42");
  EXPECT_EQ(r.metadata, nlohmann::json({{"user_id", "u-42"}}));
  // Three breakpoints, the longest 1h (the tool's, first in Anthropic's order).
  EXPECT_EQ(r.retention_floor_seconds, 3600);
}

TEST(AnthropicParserTest, DefaultsOfAMinimalRequest) {
  ApiRequest r;
  ASSERT_TRUE(ParseAnthropicMessages(Body(""), Limits(), &r).status.ok());
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, ApiRole::kUser);
  EXPECT_EQ(r.messages[0].Text(), "Hi");
  EXPECT_EQ(*r.sampling.max_tokens, 64);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_TRUE(r.sampling.stop.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_TRUE(r.tools.empty());
  EXPECT_EQ(r.tool_choice.mode, ApiToolChoice::Mode::kAuto);
  EXPECT_TRUE(r.parallel_tool_calls);
  EXPECT_EQ(r.retention_floor_seconds, 0);
  EXPECT_TRUE(r.user.empty());
  EXPECT_TRUE(r.metadata.is_null());
}

TEST(AnthropicParserTest, AcceptedFieldsThatChangeNothing) {
  const char* extras[] = {
      R"(,"thinking":{"type":"disabled"})",
      R"(,"thinking":{"type":"adaptive","display":"omitted"})",
      R"(,"thinking":{"type":"enabled","budget_tokens":1024,"display":"summarized"})",
      R"(,"service_tier":"standard_only")",
      R"(,"inference_geo":"eu","speed":"standard","diagnostics":{})",
      R"(,"output_config":{"effort":"low"})",
      R"(,"metadata":{"user_id":null,"other":1})",
      R"(,"temperature":null,"top_k":0,"stop_sequences":[])",
      R"(,"system":"")",
      R"(,"system":[])",
      R"(,"tool_choice":{"type":"none"})",
  };
  for (const char* extra : extras) {
    ApiRequest r;
    // max_tokens above the thinking budgets.
    const std::string body =
        R"({"model":"tiny","max_tokens":2000,"messages":[{"role":"user","content":"Hi"}])" +
        std::string(extra) + "}";
    const ApiError e = ParseAnthropicMessages(body, Limits(), &r);
    EXPECT_TRUE(e.status.ok()) << extra << ": " << e.status;
    ASSERT_EQ(r.messages.size(), 1u) << extra;  // no empty system message
  }
}

TEST(AnthropicParserTest, OutputConfigFormatIsStructuredOutput) {
  ApiRequest r;
  const ApiError e = ParseAnthropicMessages(
      Body(R"(,"output_config":{"effort":"high","format":{"type":"json_schema",
               "schema":{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"number"}},
                         "required":["z"],"additionalProperties":false}}})"),
      Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kJsonSchema);
  EXPECT_EQ(r.output_format.param, "output_config.format.schema");
  EXPECT_EQ(r.output_format.schema["properties"].begin().key(), "z");
  EXPECT_EQ(r.output_format.schema["required"], Json::array({"z"}));
}

TEST(AnthropicParserTest, ToolChoicesAndTools) {
  const std::string tools =
      R"(,"tools":[{"type":"custom","name":"a-b_1","input_schema":{"type":"object"}},
                   {"name":"c","description":null,"input_schema":{"type":"object"},"strict":true}])";
  struct Case {
    std::string choice;
    ApiToolChoice::Mode mode;
    bool parallel;
  } cases[] = {
      {"", ApiToolChoice::Mode::kAuto, true},
      {R"(,"tool_choice":{"type":"auto"})", ApiToolChoice::Mode::kAuto, true},
      {R"(,"tool_choice":{"type":"auto","disable_parallel_tool_use":true})",
       ApiToolChoice::Mode::kAuto, false},
      {R"(,"tool_choice":{"type":"any","disable_parallel_tool_use":false})",
       ApiToolChoice::Mode::kRequired, true},
      {R"(,"tool_choice":{"type":"tool","name":"c"})", ApiToolChoice::Mode::kFunction, true},
      {R"(,"tool_choice":{"type":"none"})", ApiToolChoice::Mode::kNone, true},
  };
  for (const Case& c : cases) {
    ApiRequest r;
    const ApiError e = ParseAnthropicMessages(Body(tools + c.choice), Limits(), &r);
    ASSERT_TRUE(e.status.ok()) << c.choice << ": " << e.status;
    EXPECT_EQ(r.tool_choice.mode, c.mode) << c.choice;
    EXPECT_EQ(r.parallel_tool_calls, c.parallel) << c.choice;
    ASSERT_EQ(r.tools.size(), 2u);
    EXPECT_EQ(r.tools[0].name, "a-b_1");
    EXPECT_FALSE(r.tools[0].strict.has_value());
    EXPECT_EQ(r.tools[1].strict, std::optional<bool>(true));
  }
}

TEST(AnthropicParserTest, ConversationShapes) {
  // A user message of tool results only; a final assistant message as a prefill; an empty final
  // assistant message dropped; a system message among the messages; an assistant message of
  // thinking only.
  ApiRequest r;
  ApiError e = ParseAnthropicMessages(R"({"model":"tiny","max_tokens":8,"messages":[
      {"role":"user","content":[{"type":"text","text":"go"}]},
      {"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},
      {"role":"user","content":[{"type":"tool_result","tool_use_id":"t1"}]},
      {"role":"system","content":"Now answer."},
      {"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":""}]},
      {"role":"user","content":"ok"},
      {"role":"assistant","content":"The answer is"}]})",
                                      Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  ASSERT_EQ(r.messages.size(), 7u);
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, "{}");
  EXPECT_TRUE(r.messages[1].content.empty());
  EXPECT_EQ(r.messages[2].role, ApiRole::kTool);
  EXPECT_EQ(r.messages[2].tool_call_id, "t1");
  EXPECT_EQ(r.messages[2].Text(), "");
  EXPECT_EQ(r.messages[3].role, ApiRole::kSystem);
  EXPECT_EQ(r.messages[3].Text(), "Now answer.");
  EXPECT_EQ(r.messages[4].reasoning, "hmm");
  EXPECT_EQ(r.messages[6].role, ApiRole::kAssistant);
  EXPECT_EQ(r.messages[6].Text(), "The answer is");

  for (const char* last :
       {R"({"role":"assistant","content":""})", R"({"role":"assistant","content":[]})"}) {
    ApiRequest d;
    const std::string body =
        std::string(
            R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":"x"},)") +
        last + "]}";
    ASSERT_TRUE(ParseAnthropicMessages(body, Limits(), &d).status.ok()) << last;
    ASSERT_EQ(d.messages.size(), 1u) << last;
  }
}

TEST(AnthropicParserTest, CacheControlTtlsAndTheirLimit) {
  auto floor = [](const std::string& body) {
    ApiRequest r;
    const ApiError e = ParseAnthropicMessages(body, Limits(), &r);
    EXPECT_TRUE(e.status.ok()) << body << ": " << e.status;
    return r.retention_floor_seconds;
  };
  const std::string text = R"({"type":"text","text":"x","cache_control":)";
  auto with = [&](const std::string& cc) {
    return R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":[)" + text + cc +
           "}]}]}";
  };
  EXPECT_EQ(floor(with(R"({"type":"ephemeral"})")), 300);
  EXPECT_EQ(floor(with(R"({"type":"ephemeral","ttl":"5m"})")), 300);
  EXPECT_EQ(floor(with(R"({"type":"ephemeral","ttl":"1h"})")), 3600);
  EXPECT_EQ(floor(with("null")), 0);
  // The top-level breakpoint (Anthropic's automatic caching) counts too.
  EXPECT_EQ(floor(Body(R"(,"cache_control":{"type":"ephemeral","ttl":"1h"})")), 3600);

  // Four breakpoints are allowed, five are not (Anthropic's limit and message).
  auto blocks = [&](int n, const std::string& top) {
    std::string content;
    for (int i = 0; i < n; ++i) content += (i ? "," : "") + text + R"({"type":"ephemeral"}})";
    return R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":[)" + content +
           "]}]" + top + "}";
  };
  EXPECT_EQ(floor(blocks(4, "")), 300);
  for (const std::string& body :
       {blocks(5, ""), blocks(4, R"(,"cache_control":{"type":"ephemeral"})")}) {
    ApiRequest r;
    const ApiError e = ParseAnthropicMessages(body, Limits(), &r);
    EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(e.param, "cache_control");
    EXPECT_EQ(e.status.message(),
              "cache_control: A maximum of 4 blocks with cache_control may be provided. Found 5.");
  }
  // A 1h breakpoint may not follow a 5m one (tools, then system, then messages).
  ApiRequest r;
  const ApiError e = ParseAnthropicMessages(
      R"({"model":"tiny","max_tokens":8,
          "system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}],
          "messages":[{"role":"user","content":[)" +
          text + R"({"type":"ephemeral","ttl":"1h"}}]}]})",
      Limits(), &r);
  EXPECT_EQ(e.param, "messages[0].content[0].cache_control");
  // ...but may precede one.
  EXPECT_EQ(floor(R"({"model":"tiny","max_tokens":8,
          "system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"1h"}}],
          "messages":[{"role":"user","content":[)" +
                  text + R"({"type":"ephemeral"}}]}]})"),
            3600);
}

TEST(AnthropicParserTest, CountTokensTakesNoGenerationFields) {
  ApiRequest r;
  const ApiError e = ParseAnthropicCountTokens(
      R"({"model":"tiny","system":"s","messages":[{"role":"user","content":"Hi"}],
          "tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"},
          "thinking":{"type":"enabled","budget_tokens":5000}})",
      Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(r.kind, ApiKind::kMessages);
  EXPECT_FALSE(r.sampling.max_tokens.has_value());
  EXPECT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.tool_choice.mode, ApiToolChoice::Mode::kRequired);
  for (const char* field : {"max_tokens", "temperature", "stream", "stop_sequences", "metadata"}) {
    ApiRequest c;
    const std::string body =
        std::string(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],")") + field +
        R"(":1})";
    const ApiError bad = ParseAnthropicCountTokens(body, Limits(), &c);
    EXPECT_EQ(bad.param, field);
    EXPECT_EQ(bad.status.message(), std::string(field) + ": Extra inputs are not permitted");
  }
  ApiRequest m;
  EXPECT_EQ(ParseAnthropicCountTokens(R"({"model":"x","messages":[{"role":"user","content":"x"}]})",
                                      Limits(), &m)
                .status.code(),
            absl::StatusCode::kNotFound);
}

struct Bad {
  std::string body;
  const char* param;
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  const char* error_code = "";
};

TEST(AnthropicParserTest, BadRequestsNameTheirField) {
  const std::string m = R"("model":"tiny","max_tokens":8)";
  auto msg = [&](const std::string& message) {
    return "{" + m + R"(,"messages":[)" + message + "]}";
  };
  auto user = [&](const std::string& blocks) {
    return msg(R"({"role":"user","content":[)" + blocks + "]}");
  };
  auto assistant = [&](const std::string& blocks) {
    return msg(R"({"role":"user","content":"x"},{"role":"assistant","content":[)" + blocks + "]}");
  };
  const std::string f = R"({"name":"f","input_schema":{"type":"object"}})";
  const Bad cases[] = {
      {"[1]", ""},
      {"{", ""},
      {std::string(200, '[') + std::string(200, ']'), ""},
      {R"({"max_tokens":8,"messages":[{"role":"user","content":"x"}]})", "model"},
      {R"({"model":5,"max_tokens":8,"messages":[{"role":"user","content":"x"}]})", "model"},
      {R"({"model":"other","max_tokens":8,"messages":[{"role":"user","content":"x"}]})", "model",
       absl::StatusCode::kNotFound, "model_not_found"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}]})", "max_tokens"},
      {R"({"model":"tiny","max_tokens":0,"messages":[{"role":"user","content":"x"}]})",
       "max_tokens"},
      {R"({"model":"tiny","max_tokens":1.5,"messages":[{"role":"user","content":"x"}]})",
       "max_tokens"},
      {R"({"model":"tiny","max_tokens":"8","messages":[{"role":"user","content":"x"}]})",
       "max_tokens"},
      {"{" + m + "}", "messages"},
      {"{" + m + R"(,"messages":[]})", "messages"},
      {"{" + m + R"(,"messages":{}})", "messages"},
      {msg("5"), "messages[0]"},
      {msg(R"({"content":"x"})"), "messages[0].role"},
      {msg(R"({"role":"tool","content":"x"})"), "messages[0].role"},
      {msg(R"({"role":"user"})"), "messages[0].content"},
      {msg(R"({"role":"user","content":""})"), "messages[0].content"},
      {msg(R"({"role":"user","content":[]})"), "messages[0].content"},
      {msg(R"({"role":"user","content":5})"), "messages[0].content"},
      {msg(R"({"role":"user","content":"x","name":"bob"})"), "messages[0].name"},
      {msg(R"({"role":"assistant","content":""},{"role":"user","content":"x"})"),
       "messages[0].content"},
      {user(R"("text")"), "messages[0].content[0]"},
      {user(R"({"text":"x"})"), "messages[0].content[0].type"},
      {user(R"({"type":"text"})"), "messages[0].content[0].text"},
      {user(R"({"type":"text","text":""})"), "messages[0].content[0].text"},
      {user(R"({"type":"text","text":"x","colour":"red"})"), "messages[0].content[0].colour"},
      {user(
           R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}})"),
       "messages[0].content[0].source", absl::StatusCode::kInvalidArgument, "invalid_image"},
      {user(R"({"type":"document","source":{"type":"text","media_type":"text/plain","data":"x"}})"),
       "messages[0].content[0]", absl::StatusCode::kInvalidArgument, "unsupported_content"},
      {user(R"({"type":"search_result"})"), "messages[0].content[0].type",
       absl::StatusCode::kInvalidArgument, "unsupported_content"},
      {user(R"({"type":"tool_use","id":"t","name":"f","input":{}})"),
       "messages[0].content[0].type"},
      {user(R"({"type":"thinking","thinking":"x","signature":""})"), "messages[0].content[0].type"},
      {user(R"({"type":"tool_result"})"), "messages[0].content[0].tool_use_id"},
      {user(R"({"type":"tool_result","tool_use_id":"bad id"})"),
       "messages[0].content[0].tool_use_id"},
      {user(R"({"type":"tool_result","tool_use_id":"t","content":5})"),
       "messages[0].content[0].content"},
      {user(R"({"type":"tool_result","tool_use_id":"t","content":[{"type":"image"}]})"),
       "messages[0].content[0].content[0].source"},
      {user(R"({"type":"tool_result","tool_use_id":"t","is_error":"yes"})"),
       "messages[0].content[0].is_error"},
      {assistant(R"({"type":"tool_result","tool_use_id":"t"})"), "messages[1].content[0].type"},
      {assistant(R"({"type":"tool_use","name":"f","input":{}})"), "messages[1].content[0].id"},
      {assistant(R"({"type":"tool_use","id":"t","input":{}})"), "messages[1].content[0].name"},
      {assistant(R"({"type":"tool_use","id":"t","name":"f"})"), "messages[1].content[0].input"},
      {assistant(R"({"type":"tool_use","id":"t","name":"f","input":"{}"})"),
       "messages[1].content[0].input"},
      {assistant(R"({"type":"thinking","signature":""})"), "messages[1].content[0].thinking"},
      {assistant(R"({"type":"redacted_thinking"})"), "messages[1].content[0].data"},
      {"{" + m + R"(,"system":5,"messages":[{"role":"user","content":"x"}]})", "system"},
      {"{" + m + R"(,"system":[{"type":"image"}],"messages":[{"role":"user","content":"x"}]})",
       "system[0].type", absl::StatusCode::kInvalidArgument, "unsupported_content"},
      {"{" + m +
           R"(,"system":[{"type":"text","text":""}],"messages":[{"role":"user","content":"x"}]})",
       "system[0].text"},
      {Body(R"(,"temperature":1.5)"), "temperature"},
      {Body(R"(,"temperature":"hot")"), "temperature"},
      {Body(R"(,"top_p":0)"), "top_p"},
      {Body(R"(,"top_p":1.1)"), "top_p"},
      {Body(R"(,"top_k":-1)"), "top_k"},
      {Body(R"(,"top_k":2.5)"), "top_k"},
      {Body(R"(,"stream":"yes")"), "stream"},
      {Body(R"(,"stop_sequences":"END")"), "stop_sequences"},
      {Body(R"(,"stop_sequences":[5])"), "stop_sequences[0]"},
      {Body(R"(,"stop_sequences":[""])"), "stop_sequences"},
      {Body(
           R"(,"stop_sequences":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"])"),
       "stop_sequences"},
      {Body(R"(,"metadata":"x")"), "metadata"},
      {Body(R"(,"metadata":{"user_id":5})"), "metadata.user_id"},
      {Body(R"(,"thinking":{"type":"enabled"})"), "thinking.budget_tokens"},
      {Body(R"(,"thinking":{"type":"enabled","budget_tokens":1000})"), "thinking.budget_tokens"},
      {Body(R"(,"thinking":{"type":"enabled","budget_tokens":1024})"),
       "thinking.budget_tokens"},  // not below max_tokens (8)
      {Body(R"(,"thinking":{"type":"sometimes"})"), "thinking.type"},
      {Body(R"(,"thinking":{"type":"disabled","budget_tokens":1024})"), "thinking.budget_tokens"},
      {Body(R"(,"thinking":true)"), "thinking"},
      {Body(R"(,"service_tier":"premium")"), "service_tier"},
      {Body(R"(,"output_config":{"format":{"type":"json_schema"}})"),
       "output_config.format.schema"},
      {Body(R"(,"output_config":{"format":{"type":"json_schema","schema":[]}})"),
       "output_config.format.schema"},
      {Body(R"(,"output_config":{"format":{"type":"xml","schema":{}}})"),
       "output_config.format.type"},
      {Body(R"(,"output_config":{"format":{"type":"json_schema","schema":{},"x":1}})"),
       "output_config.format.x"},
      {Body(R"(,"container":"c1")"), "container", absl::StatusCode::kInvalidArgument,
       "unsupported_parameter"},
      {Body(R"(,"temprature":0.5)"), "temprature"},
      {Body(R"(,"n":2)"), "n"},
      {Body(R"(,"cache_control":{"type":"persistent"})"), "cache_control.type"},
      {Body(R"(,"cache_control":{"type":"ephemeral","ttl":"2h"})"), "cache_control.ttl"},
      {Body(R"(,"cache_control":"ephemeral")"), "cache_control"},
      // Tools.
      {Body(R"(,"tools":{})"), "tools"},
      {Body(R"(,"tools":[5])"), "tools[0]"},
      {Body(R"(,"tools":[{"type":"bash_20250124","name":"bash"}])"), "tools[0].type",
       absl::StatusCode::kInvalidArgument, "unsupported_parameter"},
      {Body(R"(,"tools":[{"type":"web_search_20250305","name":"web_search"}])"), "tools[0].type",
       absl::StatusCode::kInvalidArgument, "unsupported_parameter"},
      {Body(R"(,"tools":[{"input_schema":{"type":"object"}}])"), "tools[0].name"},
      {Body(R"(,"tools":[{"name":"bad name","input_schema":{"type":"object"}}])"), "tools[0].name"},
      {Body(R"(,"tools":[{"name":")" + std::string(65, 'a') +
            R"(","input_schema":{"type":"object"}}])"),
       "tools[0].name"},
      {Body(",\"tools\":[" + f + "," + f + "]"), "tools[1].name"},
      {Body(R"(,"tools":[{"name":"f"}])"), "tools[0].input_schema"},
      {Body(R"(,"tools":[{"name":"f","input_schema":[]}])"), "tools[0].input_schema"},
      {Body(R"(,"tools":[{"name":"f","input_schema":{"properties":{}}}])"),
       "tools[0].input_schema.type"},
      {Body(R"(,"tools":[{"name":"f","input_schema":{"type":"string"}}])"),
       "tools[0].input_schema.type"},
      {Body(R"(,"tools":[{"name":"f","input_schema":{"type":"object","properties":[]}}])"),
       "tools[0].input_schema.properties"},
      {Body(R"(,"tools":[{"name":"f","input_schema":{"type":"object","required":"x"}}])"),
       "tools[0].input_schema.required"},
      {Body(R"(,"tools":[{"name":"f","input_schema":{"type":"object"},"parameters":{}}])"),
       "tools[0].parameters"},
      {Body(R"(,"tools":[{"name":"f","input_schema":{"type":"object"},"cache_control":{}}])"),
       "tools[0].cache_control.type"},
      // Tool choice.
      {Body(R"(,"tool_choice":{"type":"auto"})"), "tool_choice"},  // no tools
      {Body(R"(,"tool_choice":"auto")"), "tool_choice"},
      {Body(",\"tools\":[" + f + R"(],"tool_choice":{"type":"required"})"), "tool_choice.type"},
      {Body(",\"tools\":[" + f + R"(],"tool_choice":{"type":"tool"})"), "tool_choice.name"},
      {Body(",\"tools\":[" + f + R"(],"tool_choice":{"type":"tool","name":"g"})"),
       "tool_choice.name"},
      {Body(",\"tools\":[" + f + R"(],"tool_choice":{"type":"any","disable_parallel_tool_use":1})"),
       "tool_choice.disable_parallel_tool_use"},
      {Body(",\"tools\":[" + f +
            R"(],"tool_choice":{"type":"none","disable_parallel_tool_use":true})"),
       "tool_choice.disable_parallel_tool_use"},
  };
  for (const Bad& c : cases) {
    ApiRequest r;
    const ApiError e = ParseAnthropicMessages(c.body, Limits(), &r);
    EXPECT_EQ(e.status.code(), c.code) << c.body << ": " << e.status;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.status;
    EXPECT_EQ(e.code, c.error_code) << c.body;
    EXPECT_FALSE(e.status.message().empty()) << c.body;
  }
}

TEST(AnthropicParserTest, MessagesOfTheRefusals) {
  auto message = [](const std::string& body) {
    ApiRequest r;
    return std::string(ParseAnthropicMessages(body, Limits(), &r).status.message());
  };
  EXPECT_EQ(message(Body(R"(,"colour":"red")")), "colour: Extra inputs are not permitted");
  EXPECT_EQ(message(R"({"model":"tiny","messages":[{"role":"user","content":"x"}]})"),
            "max_tokens: Field required");
  EXPECT_EQ(
      message(
          R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":[{"type":"image"}]}]})"),
      "messages[0].content[0].source: Field required");
  EXPECT_EQ(message(Body(R"(,"tools":[{"type":"bash_20250124","name":"bash"}])")),
            "tools[0].type: tools of type 'bash_20250124' (Anthropic's server and client tools) "
            "are not supported by this server; define a custom tool with a name and an "
            "input_schema");
  EXPECT_EQ(message(Body(R"(,"temperature":2)")), "temperature: must be a number in [0, 1], not 2");
}

TEST(AnthropicParserTest, LimitsAndHostileBodies) {
  ApiLimits limits = Limits();
  limits.max_messages = 2;
  limits.max_tools = 1;
  limits.max_tools_bytes = 100;
  ApiRequest r;
  EXPECT_EQ(ParseAnthropicMessages(
                R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":"a"},
                    {"role":"assistant","content":"b"},{"role":"user","content":"c"}]})",
                limits, &r)
                .param,
            "messages");
  const std::string f = R"({"name":"f","input_schema":{"type":"object"}})";
  EXPECT_EQ(ParseAnthropicMessages(Body(",\"tools\":[" + f + "," + f + "]"), limits, &r).param,
            "tools");
  EXPECT_EQ(ParseAnthropicMessages(
                Body(R"(,"tools":[{"name":"f","description":")" + std::string(200, 'x') +
                     R"(","input_schema":{"type":"object"}}])"),
                limits, &r)
                .param,
            "tools");
  // Deep nesting anywhere is refused before anything recurses over it.
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& body :
       {deep, Body(R"(,"metadata":{"a":)" + deep + "}"),
        R"({"model":"tiny","max_tokens":8,"messages":[{"role":"assistant","content":[
           {"type":"tool_use","id":"t","name":"f","input":{"a":)" +
            deep + "}}]}]}"}) {
    ApiRequest d;
    const ApiError e = ParseAnthropicMessages(body, Limits(), &d);
    EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(e.param, "");
  }
  // Truncations of a valid body: refused, never a crash.
  const std::string good = Body(R"(,"system":[{"type":"text","text":"s"}],"tools":[)" + f + "]");
  for (size_t n = 0; n < good.size(); ++n) {
    ApiRequest t;
    EXPECT_FALSE(ParseAnthropicMessages(good.substr(0, n), Limits(), &t).status.ok()) << n;
  }
  ApiRequest ok;
  EXPECT_TRUE(ParseAnthropicMessages(good, Limits(), &ok).status.ok());
}

// Large bodies within --max_body_bytes parse within the JSON limits (request_json.h): an input
// schema of 300,000 properties is parsed, keeps its order, and meets max_tools_bytes; over a
// smaller limit it is refused as it is parsed, naming the limit and where; a long string and
// duplicate keys (the last value wins).
TEST(AnthropicParserTest, LargeBodiesMeetTheJsonLimits) {
  std::string properties = "{";
  for (int i = 0; i < 300000; ++i) {
    absl::StrAppend(&properties, i ? "," : "", "\"p", 299999 - i, "\":{}");
  }
  properties += "}";
  const std::string body = Body(R"(,"tools":[{"name":"f","input_schema":{"type":"object",)"
                                R"("properties":)" +
                                properties + "}}]");
  ApiLimits limits = Limits();
  limits.max_tools_bytes = 16 << 20;
  ApiRequest r;
  ApiError e = ParseAnthropicMessages(body, limits, &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  const Json& parsed = r.tools[0].parameters["properties"];
  ASSERT_EQ(parsed.size(), 300000u);
  EXPECT_EQ(parsed.begin().key(), "p299999");  // the client's order
  EXPECT_EQ(parsed.rbegin().key(), "p0");
  ApiRequest r2;
  EXPECT_EQ(ParseAnthropicMessages(body, Limits(), &r2).param, "tools");  // max_tools_bytes

  limits.json = RequestJsonLimits(1 << 20, 0);  // 131,072 keys and elements
  ApiRequest r3;
  e = ParseAnthropicMessages(body, limits, &r3);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.param, "tools[0].input_schema.properties");
  EXPECT_NE(e.status.message().find("more than 131072 JSON keys and array elements"),
            std::string::npos)
      << e.status;

  limits.json = RequestJsonLimits(64 << 10, 0);
  ApiRequest r4;
  e = ParseAnthropicMessages(Body(R"(,"system":")" + std::string((64 << 10) + 1, 's') + "\""),
                             limits, &r4);
  EXPECT_EQ(e.param, "system");
  EXPECT_NE(e.status.message().find("longer than 65536 bytes"), std::string::npos) << e.status;

  ApiRequest dup;
  ASSERT_TRUE(ParseAnthropicMessages(
                  R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":"a"}],
                      "max_tokens":9,"temperature":0.5,"temperature":0.25})",
                  Limits(), &dup)
                  .status.ok());
  EXPECT_EQ(*dup.sampling.max_tokens, 9);
  EXPECT_EQ(dup.sampling.temperature, 0.25f);
}

// ---------------------------------------------------------------------------------------------
// The writer.

ChoiceOutputs Answer() {
  ChoiceOutputs c;
  c.reasoning = "Both need a lookup.";
  c.text = "Checking.";
  c.tool_calls = {{"call_a", "get_weather", R"({"city": "Paris", "units": "c"})"},
                  {"call_b", "get_time", R"({"zone":"CET"})"}};
  c.finish_reason = "tool_calls";
  return c;
}

UsageCounts Usage() {
  UsageCounts u;
  u.prompt_tokens = 100;
  u.cached_tokens = 64;
  u.completion_tokens = 30;
  u.reasoning_tokens = 7;
  return u;
}

TEST(AnthropicWriterTest, FullBody) {
  AnthropicWriter w("msg_01", "tiny", 100);
  EXPECT_EQ(
      w.Full({Answer()}, Usage()),
      R"({"id":"msg_01","type":"message","role":"assistant","model":"tiny","content":[)"
      R"({"type":"thinking","thinking":"Both need a lookup.","signature":""},)"
      R"({"type":"text","text":"Checking."},)"
      R"({"type":"tool_use","id":"call_a","name":"get_weather","input":{"city":"Paris","units":"c"}},)"
      R"({"type":"tool_use","id":"call_b","name":"get_time","input":{"zone":"CET"}}],)"
      R"("stop_reason":"tool_use","stop_sequence":null,)"
      R"("usage":{"input_tokens":36,"cache_creation_input_tokens":0,"cache_read_input_tokens":64,)"
      R"("output_tokens":30,"output_tokens_details":{"thinking_tokens":7}}})");

  // Nothing at all: no empty text block. Arguments that are not an object: input {}.
  ChoiceOutputs empty;
  empty.finish_reason = "stop";
  UsageCounts u;
  u.prompt_tokens = 5;
  EXPECT_EQ(w.Full({empty}, u),
            R"({"id":"msg_01","type":"message","role":"assistant","model":"tiny","content":[],)"
            R"("stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":5,)"
            R"("cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0}})");
  ChoiceOutputs broken;
  broken.tool_calls = {{"call_c", "f", R"({"a": [1, 2)"}, {"call_d", "f", "[1]"}};
  broken.finish_reason = "length";
  const Json j = Json::parse(w.Full({broken}, u));
  EXPECT_EQ(j["content"][0]["input"], Json::object());
  EXPECT_EQ(j["content"][1]["input"], Json::object());
  EXPECT_EQ(j["stop_reason"], "max_tokens");
}

TEST(AnthropicWriterTest, StopReasons) {
  struct Case {
    const char* finish;
    const char* matched;
    Json stop_reason;
    Json stop_sequence;
  } cases[] = {
      {"stop", "", "end_turn", nullptr},     {"stop", "END", "stop_sequence", "END"},
      {"length", "", "max_tokens", nullptr}, {"tool_calls", "", "tool_use", nullptr},
      {"abort", "", "end_turn", nullptr},    {"error", "", "end_turn", nullptr},
  };
  for (const Case& c : cases) {
    AnthropicWriter w("msg_1", "tiny", 3);
    ChoiceOutputs o;
    o.text = "x";
    o.finish_reason = c.finish;
    o.matched_stop = c.matched;
    const Json full = Json::parse(w.Full({o}, UsageCounts()));
    EXPECT_EQ(full["stop_reason"], c.stop_reason) << c.finish;
    EXPECT_EQ(full["stop_sequence"], c.stop_sequence) << c.finish;
    // The stream's message_delta says the same.
    AnthropicWriter s("msg_1", "tiny", 3);
    s.StreamStart(0);
    const std::string end = s.StreamEnd({o}, UsageCounts());
    const size_t at = end.find("event: message_delta\ndata: ");
    ASSERT_NE(at, std::string::npos);
    const size_t data = at + std::string("event: message_delta\ndata: ").size();
    const Json delta = Json::parse(end.substr(data, end.find("\n\n", data) - data));
    EXPECT_EQ(delta["delta"]["stop_reason"], c.stop_reason) << c.finish;
    EXPECT_EQ(delta["delta"]["stop_sequence"], c.stop_sequence) << c.finish;
  }
}

struct SseEvent {
  std::string type;
  Json data;
};

// Splits SSE text into events, checking the framing.
std::vector<SseEvent> Events(const std::string& sse) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "an unterminated event: " << sse.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = sse.substr(pos, end - pos);
    pos = end + 2;
    const size_t nl = event.find('\n');
    EXPECT_EQ(event.substr(0, 7), "event: ");
    EXPECT_EQ(event.substr(nl + 1, 6), "data: ");
    SseEvent e{event.substr(7, nl - 7), Json::parse(event.substr(nl + 7))};
    EXPECT_EQ(e.data["type"], e.type) << event;
    out.push_back(std::move(e));
  }
  return out;
}

TEST(AnthropicWriterTest, StreamOfThinkingTextAndTwoToolCalls) {
  AnthropicWriter w("msg_02", "tiny", 100);
  std::string sse = w.StreamStart(0);
  EXPECT_EQ(w.StreamStart(1), "");  // one answer only
  auto delta = [](std::string reasoning, std::string text, std::vector<ToolCallDelta> calls) {
    ChoiceOutputs d;
    d.reasoning = std::move(reasoning);
    d.text = std::move(text);
    d.tool_call_deltas = std::move(calls);
    return d;
  };
  sse += w.StreamDelta(0, delta("Both need ", "", {}));
  sse += w.StreamDelta(0, delta("a lookup.", "", {}));
  sse += w.StreamDelta(0, delta("", "Check", {}));
  sse += w.StreamDelta(0, delta("", "ing.", {{0, "call_a", "get_weather", ""}}));
  sse += w.StreamDelta(0, delta("", "", {{0, "", "", R"({"city": )"}}));
  sse += w.StreamDelta(0, delta("", "",
                                {{0, "", "", R"("Paris", "units": "c"})"},
                                 {1, "call_b", "get_time", R"({"zone")"}}));
  sse += w.StreamDelta(0, delta("", "", {{1, "", "", R"(:"CET"})"}}));
  ChoiceOutputs finish;
  finish.finish_reason = "tool_calls";
  sse += w.StreamDelta(0, finish);  // the finish waits for StreamEnd
  sse += w.StreamEnd({Answer()}, Usage());

  const std::vector<SseEvent> events = Events(sse);
  std::vector<std::string> types;
  for (const SseEvent& e : events) types.push_back(e.type);
  const std::vector<std::string> expected = {"message_start",       "ping",
                                             "content_block_start",  // 0 thinking
                                             "content_block_delta", "content_block_delta",
                                             "content_block_delta",  // signature
                                             "content_block_stop",
                                             "content_block_start",  // 1 text
                                             "content_block_delta", "content_block_delta",
                                             "content_block_stop",
                                             "content_block_start",  // 2 tool_use call_a
                                             "content_block_delta", "content_block_delta",
                                             "content_block_stop",
                                             "content_block_start",  // 3 tool_use call_b
                                             "content_block_delta", "content_block_delta",
                                             "content_block_stop",  "message_delta",
                                             "message_stop"};
  ASSERT_EQ(types, expected) << sse;

  EXPECT_EQ(events[0].data.dump(),
            R"({"type":"message_start","message":{"id":"msg_02","type":"message",)"
            R"("role":"assistant","content":[],"model":"tiny","stop_reason":null,)"
            R"("stop_sequence":null,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,)"
            R"("cache_read_input_tokens":0,"output_tokens":0}}})");
  EXPECT_EQ(events[1].data.dump(), R"({"type":"ping"})");
  EXPECT_EQ(events[2].data.dump(),
            R"({"type":"content_block_start","index":0,)"
            R"("content_block":{"type":"thinking","thinking":"","signature":""}})");
  EXPECT_EQ(events[3].data.dump(), R"({"type":"content_block_delta","index":0,)"
                                   R"("delta":{"type":"thinking_delta","thinking":"Both need "}})");
  EXPECT_EQ(events[5].data.dump(), R"({"type":"content_block_delta","index":0,)"
                                   R"("delta":{"type":"signature_delta","signature":""}})");
  EXPECT_EQ(events[6].data.dump(), R"({"type":"content_block_stop","index":0})");
  EXPECT_EQ(
      events[7].data.dump(),
      R"({"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}})");
  EXPECT_EQ(
      events[9].data.dump(),
      R"({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"ing."}})");
  EXPECT_EQ(events[11].data.dump(),
            R"({"type":"content_block_start","index":2,"content_block":{"type":"tool_use",)"
            R"("id":"call_a","name":"get_weather","input":{}}})");
  EXPECT_EQ(events[12].data.dump(),
            R"({"type":"content_block_delta","index":2,)"
            R"("delta":{"type":"input_json_delta","partial_json":"{\"city\": "}})");
  EXPECT_EQ(events[15].data.dump(),
            R"({"type":"content_block_start","index":3,"content_block":{"type":"tool_use",)"
            R"("id":"call_b","name":"get_time","input":{}}})");
  EXPECT_EQ(events[18].data.dump(), R"({"type":"content_block_stop","index":3})");
  EXPECT_EQ(events[19].data.dump(),
            R"({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},)"
            R"("usage":{"input_tokens":36,"cache_creation_input_tokens":0,)"
            R"("cache_read_input_tokens":64,"output_tokens":30,)"
            R"("output_tokens_details":{"thinking_tokens":7}}})");
  EXPECT_EQ(events[20].data.dump(), R"({"type":"message_stop"})");

  // Each block's deltas carry its index; the pieces add up to the whole answer.
  std::vector<std::string> joined(4);
  for (const SseEvent& e : events) {
    if (e.type != "content_block_delta") continue;
    const int index = e.data["index"].get<int>();
    ASSERT_GE(index, 0);
    ASSERT_LT(index, 4);
    const Json& d = e.data["delta"];
    const std::string kind = d["type"].get<std::string>();
    if (kind == "thinking_delta") joined[index] += d["thinking"].get<std::string>();
    if (kind == "text_delta") joined[index] += d["text"].get<std::string>();
    if (kind == "input_json_delta") joined[index] += d["partial_json"].get<std::string>();
  }
  EXPECT_EQ(joined[0], Answer().reasoning);
  EXPECT_EQ(joined[1], Answer().text);
  EXPECT_EQ(joined[2], Answer().tool_calls[0].arguments);
  EXPECT_EQ(joined[3], Answer().tool_calls[1].arguments);
}

TEST(AnthropicWriterTest, StreamEdges) {
  // An answer with nothing: start, then the end (no block).
  AnthropicWriter w("msg_03", "tiny", 4);
  std::string sse = w.StreamStart(0);
  ChoiceOutputs stop;
  stop.finish_reason = "stop";
  stop.matched_stop = "END";
  EXPECT_EQ(w.StreamDelta(0, stop), "");
  sse += w.StreamEnd({stop}, UsageCounts());
  std::vector<std::string> types;
  for (const SseEvent& e : Events(sse)) types.push_back(e.type);
  EXPECT_EQ(types,
            (std::vector<std::string>{"message_start", "ping", "message_delta", "message_stop"}));
  // A delta of another choice writes nothing; a delta before StreamStart starts the message.
  AnthropicWriter v("msg_04", "tiny", 4);
  ChoiceOutputs text;
  text.text = "hi";
  EXPECT_EQ(v.StreamDelta(1, text), "");
  const std::vector<SseEvent> events = Events(v.StreamDelta(0, text));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].type, "message_start");
  EXPECT_EQ(events[2].type, "content_block_start");
  // Text after a tool call opens a new block.
  ChoiceOutputs call;
  call.tool_call_deltas = {{0, "call_x", "f", "{}"}};
  std::string more = v.StreamDelta(0, call);
  more += v.StreamDelta(0, text);
  std::vector<int> starts;
  for (const SseEvent& e : Events(more)) {
    if (e.type == "content_block_start") starts.push_back(e.data["index"].get<int>());
  }
  EXPECT_EQ(starts, (std::vector<int>{1, 2}));
}

TEST(AnthropicWriterTest, Errors) {
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kPermissionDenied), 403);
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kNotFound), 404);
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kUnavailable), 529);
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kInternal), 500);
  EXPECT_EQ(AnthropicHttpStatus(absl::StatusCode::kDeadlineExceeded), 504);
  EXPECT_EQ(AnthropicErrorType(400), "invalid_request_error");
  EXPECT_EQ(AnthropicErrorType(401), "authentication_error");
  EXPECT_EQ(AnthropicErrorType(402), "billing_error");
  EXPECT_EQ(AnthropicErrorType(403), "permission_error");
  EXPECT_EQ(AnthropicErrorType(404), "not_found_error");
  EXPECT_EQ(AnthropicErrorType(413), "request_too_large");
  EXPECT_EQ(AnthropicErrorType(429), "rate_limit_error");
  EXPECT_EQ(AnthropicErrorType(500), "api_error");
  EXPECT_EQ(AnthropicErrorType(501), "api_error");
  EXPECT_EQ(AnthropicErrorType(504), "timeout_error");
  EXPECT_EQ(AnthropicErrorType(529), "overloaded_error");

  EXPECT_EQ(AnthropicErrorBody(absl::InvalidArgumentError("max_tokens: Field required"), "t1"),
            R"({"type":"error","error":{"type":"invalid_request_error",)"
            R"("message":"max_tokens: Field required"},"request_id":"t1"})");
  EXPECT_EQ(AnthropicErrorBody(absl::UnavailableError("no capacity"), ""),
            R"({"type":"error","error":{"type":"overloaded_error","message":"no capacity"},)"
            R"("request_id":null})");
  // Invalid UTF-8 in a message (it may quote the client) is replaced, not a failure.
  const Json bad = Json::parse(AnthropicErrorBody(absl::NotFoundError("bad \xff byte"), "t"));
  EXPECT_EQ(bad["error"]["type"], "not_found_error");

  AnthropicWriter w("msg_05", "tiny", 1);
  const std::vector<SseEvent> events =
      Events(w.StreamError({absl::UnavailableError("overloaded"), "", ""}, "t2"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, "error");
  EXPECT_EQ(events[0].data.dump(),
            R"({"type":"error","error":{"type":"overloaded_error","message":"overloaded"},)"
            R"("request_id":"t2"})");
}

}  // namespace
}  // namespace ferry
