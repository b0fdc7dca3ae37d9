// The OpenAI Responses adapter: the request parser (every field, valid and refused, and input
// items into the internal conversation), the response store (bounds, TTL on a fake clock, tenant
// isolation, delete), previous_response_id chaining, and the writer's body and event stream.

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/api/request_json.h"
#include "router/api/response_store.h"
#include "router/api/responses_parser.h"
#include "router/api/responses_writer.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

ApiLimits Limits() {
  ApiLimits l;
  l.model = "tiny";
  l.vocab_size = 512;
  l.max_messages = 16;
  l.max_tools = 3;
  l.max_tools_bytes = 2048;
  return l;
}

ApiError Parse(const std::string& body, ApiRequest* r) { return ParseResponses(body, Limits(), r); }

// A request body: {"model": "tiny", "input": "hi"} with `extra` members (JSON text) added.
std::string Body(const std::string& extra) {
  return extra.empty() ? R"({"model":"tiny","input":"hi"})"
                       : absl::StrCat(R"({"model":"tiny","input":"hi",)", extra, "}");
}

TEST(ResponsesParserTest, EveryFieldBecomesTheInternalModel) {
  ApiRequest r;
  ApiError e = Parse(R"({
      "model": "tiny", "input": "Hello", "instructions": "Be brief.",
      "previous_response_id": "resp_abc", "store": false, "metadata": {"k": "v"},
      "user": "u1", "max_output_tokens": 9, "temperature": 0.5, "top_p": 0.9, "stream": true,
      "stream_options": {"include_obfuscation": false},
      "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}, "strict": true}],
      "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false,
      "reasoning": {"effort": "low", "summary": null}, "text": {"format": {"type": "text"},
      "verbosity": "low"}, "truncation": "disabled", "include": ["reasoning.encrypted_content"],
      "background": false, "prompt_cache_key": "p", "service_tier": "auto",
      "safety_identifier": "s", "top_logprobs": 0, "max_tool_calls": 3})",
                     &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  EXPECT_EQ(r.kind, ApiKind::kResponses);
  EXPECT_EQ(r.model, "tiny");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, ApiRole::kUser);
  EXPECT_EQ(r.messages[0].Text(), "Hello");
  EXPECT_EQ(r.instructions, "Be brief.");
  EXPECT_EQ(r.previous_response_id, "resp_abc");
  EXPECT_FALSE(r.store);
  EXPECT_EQ(r.metadata, nlohmann::json({{"k", "v"}}));
  EXPECT_EQ(r.user, "u1");
  EXPECT_EQ(*r.sampling.max_tokens, 9);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_TRUE(r.stream);
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "get_weather");
  EXPECT_EQ(r.tools[0].description, "Weather");
  EXPECT_EQ(r.tools[0].parameters["required"], Json::array({"city"}));
  EXPECT_EQ(r.tools[0].strict, std::optional<bool>(true));
  EXPECT_EQ(r.tool_choice.mode, ApiToolChoice::Mode::kFunction);
  EXPECT_EQ(r.tool_choice.function, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
}

TEST(ResponsesParserTest, TextFormatIsStructuredOutput) {
  ApiRequest r;
  ApiError e = Parse(Body(R"("text":{"format":{"type":"json_schema","name":"event","strict":true,
      "description":"An event","schema":{"type":"object","properties":{"when":{"type":"string",
      "format":"date"}},"required":["when"],"additionalProperties":false}}})"),
                     &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kJsonSchema);
  EXPECT_EQ(r.output_format.name, "event");
  EXPECT_TRUE(r.output_format.strict);
  EXPECT_EQ(r.output_format.param, "text.format.schema");
  EXPECT_EQ(r.output_format.schema["required"], Json::array({"when"}));

  r = ApiRequest();
  e = Parse(Body(R"("text":{"format":{"type":"json_object"},"verbosity":"low"})"), &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kJsonObject);

  r = ApiRequest();
  e = Parse(Body(R"("text":{"format":{"type":"text"}})"), &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kText);
}

TEST(ResponsesParserTest, Defaults) {
  ApiRequest r;
  ASSERT_TRUE(Parse(Body(""), &r).status.ok());
  EXPECT_TRUE(r.store);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.sampling.max_tokens.has_value());
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_EQ(r.sampling.n, 1);
  EXPECT_TRUE(r.instructions.empty());
  EXPECT_TRUE(r.previous_response_id.empty());
  EXPECT_TRUE(r.tools.empty());
  EXPECT_TRUE(r.parallel_tool_calls);
  // Nulls are absent, as OpenAI has them.
  ApiRequest n;
  ASSERT_TRUE(Parse(Body(R"("instructions":null,"previous_response_id":null,"store":null,
                            "metadata":null,"max_output_tokens":null,"temperature":null,
                            "tools":null,"tool_choice":null,"text":null,"reasoning":null,
                            "conversation":null,"prompt":null)"),
                    &n)
                  .status.ok());
  EXPECT_TRUE(n.store);
}

TEST(ResponsesParserTest, MessageItemsAndContentParts) {
  ApiRequest r;
  ApiError e = Parse(R"({"model": "tiny", "input": [
      {"role": "developer", "content": "Rules."},
      {"role": "system", "content": [{"type": "input_text", "text": "More rules."}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi "},
                                                      {"type": "input_text", "text": "there"}]},
      {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
       "content": [{"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}]},
      {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
      {"role": "user", "content": ""}]})",
                     &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0].role, ApiRole::kSystem);
  EXPECT_EQ(r.messages[0].Text(), "Rules.");
  EXPECT_EQ(r.messages[1].role, ApiRole::kSystem);
  EXPECT_EQ(r.messages[2].role, ApiRole::kUser);
  EXPECT_EQ(r.messages[2].Text(), "Hi there");
  EXPECT_EQ(r.messages[3].role, ApiRole::kAssistant);
  EXPECT_EQ(r.messages[3].Text(), "Hello!");
  EXPECT_EQ(r.messages[4].Text(), "No.");
  EXPECT_EQ(r.messages[5].Text(), "");
}

// What a client sends back after a response that reasoned and called two functions: the output
// items and its results. They become one assistant message (reasoning and both calls) and two
// tool messages.
TEST(ResponsesParserTest, FunctionCallsAndOutputsRoundTrip) {
  ApiRequest r;
  ApiError e = Parse(R"({"model": "tiny", "input": [
      {"role": "user", "content": "Weather in Paris and Rome?"},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "Two cities."}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
       "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
      {"type": "function_call", "call_id": "call_b", "name": "get_weather",
       "arguments": "{\"city\":\"Rome\"}"},
      {"type": "function_call_output", "call_id": "call_a", "output": "18C"},
      {"type": "function_call_output", "call_id": "call_b",
       "output": [{"type": "input_text", "text": "21C"}]},
      {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "S"}],
       "encrypted_content": "opaque"},
      {"type": "message", "role": "assistant", "content": "Paris 18C, Rome 21C."}]})",
                     &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  ASSERT_EQ(r.messages.size(), 5u);
  const ApiMessage& calls = r.messages[1];
  EXPECT_EQ(calls.role, ApiRole::kAssistant);
  EXPECT_EQ(calls.reasoning, "Two cities.");
  EXPECT_EQ(calls.Text(), "");
  ASSERT_EQ(calls.tool_calls.size(), 2u);
  EXPECT_EQ(calls.tool_calls[0].id, "call_a");
  EXPECT_EQ(calls.tool_calls[0].name, "get_weather");
  EXPECT_EQ(calls.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(calls.tool_calls[1].id, "call_b");
  EXPECT_EQ(r.messages[2].role, ApiRole::kTool);
  EXPECT_EQ(r.messages[2].tool_call_id, "call_a");
  EXPECT_EQ(r.messages[2].Text(), "18C");
  EXPECT_EQ(r.messages[3].tool_call_id, "call_b");
  EXPECT_EQ(r.messages[3].Text(), "21C");
  EXPECT_EQ(r.messages[4].role, ApiRole::kAssistant);
  EXPECT_EQ(r.messages[4].reasoning, "S");  // the summary, when there is no content
  EXPECT_EQ(r.messages[4].Text(), "Paris 18C, Rome 21C.");
}

// `input += response.output` as the openai SDK (3.57) sends it, from a Full() body: its own
// transform of the output items, and their model_dump(by_alias=True) with every null.
TEST(ResponsesParserTest, TakesBackTheOutputAsTheSdkSendsIt) {
  const std::vector<std::string> outputs = {
      R"([{"id": "rs_00ff_0", "summary": [], "type": "reasoning", "content": [{"text":
          "Need the tool.", "type": "reasoning_text"}]}, {"id": "msg_00ff_1", "content":
          [{"annotations": [], "text": "Let me check.", "type": "output_text"}], "role":
          "assistant", "status": "completed", "type": "message"}, {"arguments":
          "{\"city\":\"Paris\"}", "call_id": "call_1", "name": "get_weather", "type":
          "function_call", "id": "fc_00ff_2", "status": "completed"}, {"arguments":
          "{\"city\":\"Rome\"}", "call_id": "call_2", "name": "get_weather", "type":
          "function_call", "id": "fc_00ff_3", "status": "completed"}])",
      R"([{"id": "rs_00ff_0", "summary": [], "type": "reasoning", "content": [{"text":
          "Need the tool.", "type": "reasoning_text"}], "encrypted_content": null, "status":
          null}, {"id": "msg_00ff_1", "content": [{"annotations": [], "text": "Let me check.",
          "type": "output_text", "logprobs": null}], "role": "assistant", "status": "completed",
          "type": "message", "phase": null}, {"arguments": "{\"city\":\"Paris\"}", "call_id":
          "call_1", "name": "get_weather", "type": "function_call", "id": "fc_00ff_2", "async":
          null, "caller": null, "namespace": null, "status": "completed"}, {"arguments":
          "{\"city\":\"Rome\"}", "call_id": "call_2", "name": "get_weather", "type":
          "function_call", "id": "fc_00ff_3", "async": null, "caller": null, "namespace": null,
          "status": "completed"}])",
  };
  for (const std::string& output : outputs) {
    Json input = Json::parse(output);
    input.insert(input.begin(), Json{{"role", "user"}, {"content", "Weather?"}});
    input.push_back(
        Json{{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "18C"}});
    input.push_back(
        Json{{"type", "function_call_output"}, {"call_id", "call_2"}, {"output", "21C"}});
    ApiRequest r;
    ApiError e = Parse(Json{{"model", "tiny"}, {"input", input}}.dump(), &r);
    ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
    ASSERT_EQ(r.messages.size(), 4u);
    EXPECT_EQ(r.messages[1].role, ApiRole::kAssistant);
    EXPECT_EQ(r.messages[1].reasoning, "Need the tool.");
    EXPECT_EQ(r.messages[1].Text(), "Let me check.");
    ASSERT_EQ(r.messages[1].tool_calls.size(), 2u);
    EXPECT_EQ(r.messages[1].tool_calls[1].arguments, R"({"city":"Rome"})");
    EXPECT_EQ(r.messages[3].tool_call_id, "call_2");
  }
}

TEST(ResponsesParserTest, ReasoningJoinsTheAssistantMessageAroundIt) {
  ApiRequest r;
  // An assistant message, then a call: the call joins it. Reasoning after an assistant message
  // that nothing follows goes to that message.
  ASSERT_TRUE(Parse(R"({"model": "tiny", "input": [
      {"role": "user", "content": "q"},
      {"role": "assistant", "content": "Let me look."},
      {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "r"},
      {"role": "assistant", "content": "Done."},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "after"}]},
      {"role": "user", "content": "q2"},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "cut off"}]}]})",
                    &r)
                  .status.ok());
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[1].Text(), "Let me look.");
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[3].reasoning, "after");
  EXPECT_EQ(r.messages[4].role, ApiRole::kUser);
  // Reasoning alone at the end (a response cut off while thinking): an assistant turn of its own.
  EXPECT_EQ(r.messages[5].role, ApiRole::kAssistant);
  EXPECT_EQ(r.messages[5].reasoning, "cut off");
}

struct Bad {
  std::string body;
  const char* param;
  const char* code = "";  // OpenAI's error code, when the parser gives one
  absl::StatusCode status = absl::StatusCode::kInvalidArgument;
};

TEST(ResponsesParserTest, RefusesWhatIsWrongOrUnsupportedNamingTheField) {
  const std::string item = R"({"model":"tiny","input":[)";
  const std::vector<Bad> cases = {
      {"not json", ""},
      {"[1]", ""},
      {R"({"input":"hi"})", "model"},
      {R"({"model":7,"input":"hi"})", "model"},
      {R"({"model":"big","input":"hi"})", "model", "model_not_found", absl::StatusCode::kNotFound},
      {R"({"model":"tiny"})", "input"},
      {R"({"model":"tiny","input":5})", "input"},
      {R"({"model":"tiny","input":[]})", "input"},
      {R"({"model":"tiny","input":[)" + std::string(17 * 4, ' ') + "]}", "input"},
      {item + R"(5]})", "input[0]"},
      {item + R"({"content":"x"}]})", "input[0].type"},
      {item + R"({"role":"tool","content":"x"}]})", "input[0].role"},
      {item + R"({"role":"user"}]})", "input[0].content"},
      {item + R"({"role":"user","content":7}]})", "input[0].content"},
      {item + R"({"role":"user","content":"x","name":"n"}]})", "input[0].name"},
      {item + R"({"role":"user","content":[{"type":"input_image","image_url":"u"}]}]})",
       "input[0].content[0].image_url", "invalid_image_url"},
      {item + R"({"role":"user","content":[{"type":"input_file","file_id":"f"}]}]})",
       "input[0].content[0].type", "unsupported_content"},
      {item + R"({"role":"user","content":[{"type":"input_audio"}]}]})", "input[0].content[0].type",
       "unsupported_content"},
      {item + R"({"role":"user","content":[{"type":"video"}]}]})", "input[0].content[0].type"},
      {item + R"({"role":"user","content":[{"type":"input_text"}]}]})", "input[0].content[0].text"},
      {item + R"({"role":"user","content":[{"type":"input_text","text":"a","x":1}]}]})",
       "input[0].content[0].x"},
      {item + R"({"type":"item_reference","id":"msg_1"}]})", "input[0].type",
       "unsupported_parameter"},
      {item + R"({"type":"web_search_call","id":"ws_1"}]})", "input[0].type",
       "unsupported_parameter"},
      {item + R"({"type":"function_call","name":"f","arguments":"{}"}]})", "input[0].call_id"},
      {item + R"({"type":"function_call","call_id":"c","arguments":"{}"}]})", "input[0].name"},
      {item + R"({"type":"function_call","call_id":"c","name":"f","arguments":{}}]})",
       "input[0].arguments"},
      {item + R"({"type":"function_call","call_id":"c","name":"f","arguments":"{}",
                  "namespace":"ns"}]})",
       "input[0].namespace", "unsupported_parameter"},
      {item + R"({"type":"function_call","call_id":"c","name":"f","arguments":"{}",
                  "async":true}]})",
       "input[0].async", "unsupported_parameter"},
      {item + R"({"type":"function_call_output","output":"r"}]})", "input[0].call_id"},
      {item + R"({"type":"function_call_output","call_id":"c"}]})", "input[0].output"},
      {item + R"({"type":"function_call_output","call_id":"c",
                  "output":[{"type":"input_image","image_url":"u"}]}]})",
       "input[0].output[0].type", "unsupported_content"},
      {item + R"({"type":"reasoning","summary":"s"}]})", "input[0].summary"},
      {item + R"({"type":"reasoning","summary":[{"type":"reasoning_text","text":"t"}]}]})",
       "input[0].summary[0].type"},
      {Body(R"("instructions":5)"), "instructions"},
      {Body(R"("previous_response_id":5)"), "previous_response_id"},
      {Body(R"("previous_response_id":"abc")"), "previous_response_id"},
      {Body(R"("store":"yes")"), "store"},
      {Body(R"("metadata":[])"), "metadata"},
      {Body(R"("metadata":{"k":1})"), "metadata.k"},
      {Body(R"("user":1)"), "user"},
      {Body(R"("max_output_tokens":0)"), "max_output_tokens"},
      {Body(R"("max_output_tokens":1.5)"), "max_output_tokens"},
      {Body(R"("temperature":2.5)"), "temperature"},
      {Body(R"("temperature":"hot")"), "temperature"},
      {Body(R"("top_p":0)"), "top_p"},
      {Body(R"("top_p":1.5)"), "top_p"},
      {Body(R"("stream":1)"), "stream"},
      {Body(R"("stream_options":{"include_obfuscation":true})"), "stream_options"},
      {Body(R"("stream":true,"stream_options":{"include_usage":true})"),
       "stream_options.include_usage"},
      {Body(R"("tools":{})"), "tools"},
      {Body(R"("tools":[{"type":"web_search"}])"), "tools[0].type", "unsupported_parameter"},
      {Body(R"("tools":[{"type":"file_search","vector_store_ids":[]}])"), "tools[0].type",
       "unsupported_parameter"},
      {Body(R"("tools":[{"type":"mcp","server_label":"x"}])"), "tools[0].type",
       "unsupported_parameter"},
      {Body(R"("tools":[{"type":"function","function":{"name":"f"}}])"), "tools[0].function"},
      {Body(R"("tools":[{"type":"function","name":"bad name"}])"), "tools[0].name"},
      {Body(R"("tools":[{"type":"function","name":"f","parameters":[]}])"), "tools[0].parameters"},
      {Body(R"("tools":[{"type":"function","name":"f","strict":"yes"}])"), "tools[0].strict"},
      {Body(R"("tools":[{"type":"function","name":"f"},{"type":"function","name":"f"}])"),
       "tools[1].name"},
      {Body(R"("tools":[{"type":"function","name":"a"},{"type":"function","name":"b"},
                        {"type":"function","name":"c"},{"type":"function","name":"d"}])"),
       "tools"},
      {Body(R"("tools":[{"type":"function","name":"f","description":")" + std::string(3000, 'x') +
            R"("}])"),
       "tools"},
      {Body(R"("tool_choice":"auto")"), "tool_choice"},
      {Body(R"("tools":[{"type":"function","name":"f"}],"tool_choice":"any")"), "tool_choice"},
      {Body(R"("tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function",
                                                                    "name":"g"})"),
       "tool_choice"},
      {Body(R"("tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"file_search"})"),
       "tool_choice.type", "unsupported_parameter"},
      {Body(R"("tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function"})"),
       "tool_choice.name"},
      {Body(R"("parallel_tool_calls":"no")"), "parallel_tool_calls"},
      {Body(R"("reasoning":"high")"), "reasoning"},
      {Body(R"("reasoning":{"effort":3})"), "reasoning.effort"},
      {Body(R"("reasoning":{"budget":3})"), "reasoning.budget"},
      {Body(R"("text":{"format":{"type":"json_schema","schema":{}}})"), "text.format.name"},
      {Body(R"("text":{"format":{"type":"json_schema","name":"x"}})"), "text.format.schema"},
      {Body(R"("text":{"format":{"type":"json_schema","name":"x","schema":"{}"}})"),
       "text.format.schema"},
      {Body(R"("text":{"format":{"type":"json_object","strict":true}})"), "text.format.strict"},
      {Body(R"("text":{"format":{"type":"yaml"}})"), "text.format.type"},
      {Body(R"("text":{"verbosity":"loud"})"), "text.verbosity"},
      {Body(R"("truncation":"auto")"), "truncation", "unsupported_parameter"},
      {Body(R"("truncation":"sometimes")"), "truncation"},
      {Body(R"("include":["message.output_text.logprobs"])"), "include", "unsupported_parameter"},
      {Body(R"("include":["everything"])"), "include"},
      {Body(R"("include":"reasoning.encrypted_content")"), "include"},
      {Body(R"("background":true)"), "background", "unsupported_parameter"},
      {Body(R"("top_logprobs":2)"), "top_logprobs", "unsupported_parameter"},
      {Body(R"("top_logprobs":21)"), "top_logprobs"},
      {Body(R"("conversation":"conv_1")"), "conversation", "unsupported_parameter"},
      {Body(R"("prompt":{"id":"pmpt_1"})"), "prompt", "unsupported_parameter"},
      {Body(R"("max_tokens":5)"), "max_tokens", "unrecognized_argument"},
      {Body(R"("messages":[])"), "messages", "unrecognized_argument"},
  };
  for (const Bad& c : cases) {
    ApiRequest r;
    ApiError e = Parse(c.body, &r);
    EXPECT_EQ(e.status.code(), c.status) << c.body << ": " << e.status;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.status;
    EXPECT_EQ(e.code, c.code) << c.body << ": " << e.status;
    EXPECT_FALSE(e.status.message().empty()) << c.body;
  }
  ApiRequest r;
  EXPECT_EQ(Parse(Body(R"("frobnicate":1)"), &r).status.message(),
            "Unrecognized request argument supplied: frobnicate");
}

TEST(ResponsesParserTest, MetadataHasOpenAisLimits) {
  auto metadata = [](int pairs, size_t key_chars, size_t value_chars) {
    Json m = Json::object();
    for (int i = 0; i < pairs; ++i) {
      m[absl::StrCat(i, std::string(key_chars - 1 - (i >= 10), 'k'))] =
          std::string(value_chars, 'v');
    }
    return Body(absl::StrCat(R"("metadata":)", m.dump()));
  };
  ApiRequest r;
  EXPECT_TRUE(Parse(metadata(16, 64, 512), &r).status.ok());
  EXPECT_EQ(r.metadata.size(), 16u);
  EXPECT_EQ(Parse(metadata(17, 8, 8), &r).param, "metadata");
  EXPECT_EQ(Parse(metadata(1, 65, 8), &r).param, "metadata");
  EXPECT_EQ(Parse(metadata(1, 8, 513), &r).param, absl::StrCat("metadata.0", std::string(7, 'k')));
  // Characters, not bytes: 512 two-byte characters fit.
  std::string wide;
  for (int i = 0; i < 512; ++i) wide += "\xC3\xA9";
  EXPECT_TRUE(Parse(Body(absl::StrCat(R"("metadata":{"k":")", wide, R"("})")), &r).status.ok());
}

// Untrusted bodies never crash the parser: every prefix of a full request, and every field of it
// replaced by a value of each JSON type.
// Large bodies within --max_body_bytes parse within the JSON limits (request_json.h): an input of
// a million items is parsed and meets max_messages; over a smaller limit it is refused as it is
// parsed, naming the limit and where; deep nesting, a long string, duplicate keys.
TEST(ResponsesParserTest, LargeBodiesMeetTheJsonLimits) {
  std::string items = "[";
  for (int i = 0; i < 1000000; ++i) items += i ? ",{}" : "{}";
  items += "]";
  ApiRequest r;
  ApiError e = Parse(R"({"model":"tiny","input":)" + items + "}", &r);
  EXPECT_EQ(e.param, "input");
  EXPECT_NE(e.status.message().find("1000000 items; at most 16"), std::string::npos) << e.status;
  ApiLimits limits = Limits();
  limits.json = RequestJsonLimits(1 << 20, 0);
  e = ParseResponses(R"({"model":"tiny","input":)" + items + "}", limits, &r);
  EXPECT_EQ(e.param, "input");
  EXPECT_NE(e.status.message().find("more than 131072 JSON keys and array elements"),
            std::string::npos)
      << e.status;

  e = Parse(Body(R"("text":{"format":)" + std::string(200, '[') + std::string(200, ']') + "}"), &r);
  EXPECT_NE(e.status.message().find("deeper than 128 levels (at 'text.format"), std::string::npos)
      << e.status;

  limits.json = RequestJsonLimits(64 << 10, 0);
  e = ParseResponses(Body(R"("instructions":")" + std::string((64 << 10) + 1, 'i') + "\""), limits,
                     &r);
  EXPECT_EQ(e.param, "instructions");
  EXPECT_NE(e.status.message().find("longer than 65536 bytes"), std::string::npos) << e.status;

  ApiRequest dup;
  ASSERT_TRUE(Parse(R"({"model":"tiny","input":"a","input":"b","store":true,"store":false})", &dup)
                  .status.ok());
  EXPECT_EQ(dup.messages[0].Text(), "b");
  EXPECT_FALSE(dup.store);
}

TEST(ResponsesParserTest, NeverCrashesOnMangledBodies) {
  const std::string full = R"({"model":"tiny","input":[{"role":"user","content":[{"type":
      "input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":
      "{}"},{"type":"function_call_output","call_id":"c","output":"r"},{"type":"reasoning",
      "summary":[{"type":"summary_text","text":"s"}]}],"instructions":"i","metadata":{"a":"b"},
      "tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}],
      "tool_choice":{"type":"function","name":"f"},"text":{"format":{"type":"text"}},
      "reasoning":{"effort":"low"},"include":[],"stream":true,"stream_options":{}})";
  ApiRequest ok;
  ASSERT_TRUE(Parse(full, &ok).status.ok()) << Parse(full, &ok).status;
  for (size_t n = 0; n < full.size(); ++n) {
    ApiRequest r;
    EXPECT_FALSE(Parse(full.substr(0, n), &r).status.ok());
  }
  const Json body = Json::parse(full);
  const std::vector<Json> values = {nullptr,
                                    true,
                                    -1,
                                    1.5,
                                    "x",
                                    Json::array(),
                                    Json::object(),
                                    Json::array({1, "y", nullptr}),
                                    Json{{"type", 1}},
                                    Json{{"type", "function"}}};
  // Every value in the tree, replaced by each of `values`.
  std::vector<Json::json_pointer> pointers;
  const Json flat = body.flatten();
  for (auto it = flat.begin(); it != flat.end(); ++it) {
    Json::json_pointer p(it.key());
    while (!p.empty()) {
      pointers.push_back(p);
      p = p.parent_pointer();
    }
  }
  for (const Json::json_pointer& p : pointers) {
    for (const Json& v : values) {
      Json mangled = body;
      mangled[p] = v;
      ApiRequest r;
      ApiError e = Parse(mangled.dump(), &r);
      if (!e.status.ok()) {
        EXPECT_FALSE(e.status.message().empty());
      }
    }
  }
}

// The store.

StoredResponse Response(const std::string& tenant, const std::string& id, size_t text = 10) {
  StoredResponse r;
  r.tenant = tenant;
  r.id = id;
  r.response_json = std::string(text, 'j');
  ApiMessage m;
  m.role = ApiRole::kUser;
  m.content.push_back({"hello"});
  r.conversation.push_back(m);
  return r;
}

TEST(ResponseStoreTest, PutGetDeleteAndTenantIsolation) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.clock = &clock;
  ResponseStore store(options);
  ASSERT_TRUE(store.Put(Response("t1", "resp_1")));
  std::optional<StoredResponse> got = store.Get("t1", "resp_1");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->id, "resp_1");
  EXPECT_EQ(got->tenant, "t1");
  EXPECT_EQ(got->created, clock.Now());
  EXPECT_EQ(got->response_json, std::string(10, 'j'));
  ASSERT_EQ(got->conversation.size(), 1u);
  EXPECT_EQ(got->conversation[0].Text(), "hello");
  EXPECT_EQ(got->bytes, ResponseStore::EntryBytes(*got));
  EXPECT_GT(got->bytes, 10u);
  // Another tenant sees nothing and deletes nothing.
  EXPECT_FALSE(store.Get("t2", "resp_1").has_value());
  EXPECT_FALSE(store.Delete("t2", "resp_1"));
  EXPECT_TRUE(store.Get("t1", "resp_1").has_value());
  EXPECT_FALSE(store.Get("t1", "resp_2").has_value());
  // Replacing an id does not count it twice.
  const size_t bytes = store.Bytes("t1");
  ASSERT_TRUE(store.Put(Response("t1", "resp_1")));
  EXPECT_EQ(store.Count("t1"), 1u);
  EXPECT_EQ(store.Bytes("t1"), bytes);
  EXPECT_TRUE(store.Delete("t1", "resp_1"));
  EXPECT_FALSE(store.Get("t1", "resp_1").has_value());
  EXPECT_FALSE(store.Delete("t1", "resp_1"));
  EXPECT_EQ(store.Count("t1"), 0u);
  EXPECT_EQ(store.Bytes("t1"), 0u);
}

TEST(ResponseStoreTest, EvictsTheOldestOverTheCountBound) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.clock = &clock;
  options.max_responses_per_tenant = 3;
  ResponseStore store(options);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store.Put(Response("t1", absl::StrCat("resp_", i))));
  ASSERT_TRUE(store.Put(Response("t2", "resp_x")));
  EXPECT_EQ(store.Count("t1"), 3u);
  EXPECT_FALSE(store.Get("t1", "resp_0").has_value());
  EXPECT_FALSE(store.Get("t1", "resp_1").has_value());
  for (int i = 2; i < 5; ++i) EXPECT_TRUE(store.Get("t1", absl::StrCat("resp_", i)).has_value());
  EXPECT_EQ(store.Count("t2"), 1u);  // bounds are per tenant
  EXPECT_EQ(store.stats().evicted, 2u);
}

TEST(ResponseStoreTest, EvictsTheOldestOverTheByteBoundAndRefusesTooLargeEntries) {
  FakeClock clock;
  const size_t one = ResponseStore::EntryBytes(Response("t1", "resp_0", 1000));
  ResponseStoreOptions options;
  options.clock = &clock;
  options.max_bytes_per_tenant = 2 * one + one / 2;
  ResponseStore store(options);
  ASSERT_TRUE(store.Put(Response("t1", "resp_0", 1000)));
  ASSERT_TRUE(store.Put(Response("t1", "resp_1", 1000)));
  EXPECT_EQ(store.Bytes("t1"), 2 * one);
  ASSERT_TRUE(store.Put(Response("t1", "resp_2", 1000)));
  EXPECT_FALSE(store.Get("t1", "resp_0").has_value());
  EXPECT_TRUE(store.Get("t1", "resp_1").has_value());
  EXPECT_TRUE(store.Get("t1", "resp_2").has_value());
  EXPECT_LE(store.Bytes("t1"), options.max_bytes_per_tenant);
  // An entry over the whole bound is not stored, and evicts nothing.
  EXPECT_FALSE(store.Put(Response("t1", "resp_big", 3 * one)));
  EXPECT_FALSE(store.Get("t1", "resp_big").has_value());
  EXPECT_EQ(store.Count("t1"), 2u);
  EXPECT_EQ(store.stats().evicted, 1u);
  EXPECT_EQ(store.stats().refused, 1u);
}

TEST(ResponseStoreTest, ExpiresAfterTheTtl) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.clock = &clock;
  options.ttl = absl::Minutes(10);
  ResponseStore store(options);
  ASSERT_TRUE(store.Put(Response("t1", "resp_old")));
  clock.Advance(absl::Minutes(6));
  ASSERT_TRUE(store.Put(Response("t1", "resp_new")));
  clock.Advance(absl::Minutes(4) - absl::Seconds(1));
  EXPECT_TRUE(store.Get("t1", "resp_old").has_value());
  clock.Advance(absl::Seconds(1));
  EXPECT_FALSE(store.Get("t1", "resp_old").has_value());
  EXPECT_FALSE(store.Delete("t1", "resp_old"));  // expired: absent
  EXPECT_TRUE(store.Get("t1", "resp_new").has_value());
  // A wall-clock step does not expire anything (the TTL runs on monotonic time).
  clock.SetWallTime(clock.Now() + absl::Hours(24));
  EXPECT_TRUE(store.Get("t1", "resp_new").has_value());
  // Put prunes every tenant's expired entries.
  clock.Advance(absl::Minutes(10));
  ASSERT_TRUE(store.Put(Response("t2", "resp_other")));
  EXPECT_EQ(store.Count("t1"), 0u);
  EXPECT_EQ(store.Bytes("t1"), 0u);
  EXPECT_EQ(store.stats().expired, 2u);  // resp_old (found by Delete), resp_new (by Put)
  EXPECT_EQ(store.stats().evicted, 0u);
}

// The writer and chaining.

ApiRequest Request(const std::string& body) {
  ApiRequest r;
  ApiError e = ParseResponses(body, Limits(), &r);
  EXPECT_TRUE(e.status.ok()) << e.status << " " << e.param;
  return r;
}

ChoiceOutputs Answer(const std::string& text, const std::string& finish = "stop") {
  ChoiceOutputs c;
  c.text = text;
  c.finish_reason = finish;
  return c;
}

TEST(ResponsesConversationTest, ChainsThreeResponsesWithoutCarryingInstructions) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.clock = &clock;
  ResponseStore store(options);
  UsageCounts usage;

  ApiRequest r1 = Request(R"({"model":"tiny","input":"one","instructions":"Be A."})");
  std::vector<ApiMessage> h1;
  ASSERT_TRUE(ResponsesConversation(store, "t", &r1, &h1).status.ok());
  ASSERT_EQ(r1.messages.size(), 2u);
  EXPECT_EQ(r1.messages[0].role, ApiRole::kSystem);
  EXPECT_EQ(r1.messages[0].Text(), "Be A.");
  ASSERT_EQ(h1.size(), 1u);
  ResponsesWriter w1("resp_1", 100, r1, h1, &store, "t");
  w1.Full({Answer("first")}, usage);
  EXPECT_TRUE(w1.stored());

  ApiRequest r2 = Request(
      R"({"model":"tiny","input":"two","instructions":"Be B.","previous_response_id":"resp_1"})");
  std::vector<ApiMessage> h2;
  ASSERT_TRUE(ResponsesConversation(store, "t", &r2, &h2).status.ok());
  ASSERT_EQ(r2.messages.size(), 4u);
  EXPECT_EQ(r2.messages[0].Text(), "Be B.");
  EXPECT_EQ(r2.messages[1].Text(), "one");
  EXPECT_EQ(r2.messages[2].role, ApiRole::kAssistant);
  EXPECT_EQ(r2.messages[2].Text(), "first");
  EXPECT_EQ(r2.messages[3].Text(), "two");
  ASSERT_EQ(h2.size(), 3u);  // no instructions in the history
  ResponsesWriter w2("resp_2", 101, r2, h2, &store, "t");
  w2.Full({Answer("second")}, usage);

  ApiRequest r3 = Request(R"({"model":"tiny","input":"three","previous_response_id":"resp_2"})");
  std::vector<ApiMessage> h3;
  ASSERT_TRUE(ResponsesConversation(store, "t", &r3, &h3).status.ok());
  ASSERT_EQ(r3.messages.size(), 5u);  // neither A nor B: instructions are not carried over
  const std::vector<std::string> texts = {"one", "first", "two", "second", "three"};
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(r3.messages[i].Text(), texts[i]);
    EXPECT_NE(r3.messages[i].role, ApiRole::kSystem);
  }
  EXPECT_EQ(h3.size(), 5u);

  // Unknown, or another tenant's: OpenAI's 404.
  ApiRequest r4 = Request(R"({"model":"tiny","input":"x","previous_response_id":"resp_2"})");
  std::vector<ApiMessage> h4;
  ApiError e = ResponsesConversation(store, "other", &r4, &h4);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(e.status.message(), "Previous response with id 'resp_2' not found.");
  EXPECT_EQ(e.param, "previous_response_id");
  EXPECT_EQ(e.code, "previous_response_not_found");
}

TEST(ResponsesWriterTest, FullBodyIsTheResponseObject) {
  FakeClock clock;
  ResponseStoreOptions options;
  options.clock = &clock;
  ResponseStore store(options);
  ApiRequest request = Request(R"({"model":"tiny","input":"Weather?","instructions":"Brief.",
      "temperature":0.7,"top_p":0.9,"max_output_tokens":50,"metadata":{"k":"v"},"user":"u",
      "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"}}}}],"tool_choice":"required"})");
  std::vector<ApiMessage> history;
  ASSERT_TRUE(ResponsesConversation(store, "t", &request, &history).status.ok());
  ResponsesWriter writer("resp_00ff", 1700000000, request, history, &store, "t");
  ChoiceOutputs c = Answer("Let me check.", "tool_calls");
  c.reasoning = "Need the tool.";
  c.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"},
                  {"call_2", "get_weather", R"({"city":"Rome"})"}};
  UsageCounts usage;
  usage.prompt_tokens = 30;
  usage.cached_tokens = 16;
  usage.completion_tokens = 20;
  usage.reasoning_tokens = 5;
  const std::string body = writer.Full({c}, usage);
  const Json j = Json::parse(body);
  EXPECT_EQ(j["id"], "resp_00ff");
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["created_at"], 1700000000);
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["error"].is_null());
  EXPECT_TRUE(j["incomplete_details"].is_null());
  EXPECT_EQ(j["instructions"], "Brief.");
  EXPECT_EQ(j["max_output_tokens"], 50);
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["temperature"].get<double>(), 0.7);  // as written, not 0.699999988...
  EXPECT_EQ(j["top_p"].get<double>(), 0.9);
  EXPECT_EQ(j["tool_choice"], "required");
  EXPECT_EQ(j["tools"][0]["type"], "function");
  EXPECT_EQ(j["tools"][0]["name"], "get_weather");
  EXPECT_EQ(j["tools"][0]["parameters"]["properties"]["city"]["type"], "string");
  EXPECT_TRUE(j["previous_response_id"].is_null());
  EXPECT_EQ(j["store"], true);
  EXPECT_EQ(j["truncation"], "disabled");
  EXPECT_EQ(j["text"], Json::parse(R"({"format":{"type":"text"}})"));
  EXPECT_EQ(j["user"], "u");
  EXPECT_EQ(j["metadata"], Json::parse(R"({"k":"v"})"));
  EXPECT_EQ(j["usage"], Json::parse(R"({"input_tokens":30,"input_tokens_details":
      {"cached_tokens":16,"cache_write_tokens":0},"output_tokens":20,
      "output_tokens_details":{"reasoning_tokens":5},"total_tokens":50})"));
  const Json& out = j["output"];
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0], Json::parse(R"({"id":"rs_00ff_0","type":"reasoning","summary":[],
      "content":[{"type":"reasoning_text","text":"Need the tool."}]})"));
  EXPECT_EQ(out[1], Json::parse(R"({"id":"msg_00ff_1","type":"message","status":"completed",
      "content":[{"type":"output_text","text":"Let me check.","annotations":[]}],
      "role":"assistant"})"));
  EXPECT_EQ(out[2], Json::parse(R"({"id":"fc_00ff_2","type":"function_call","status":"completed",
      "arguments":"{\"city\":\"Paris\"}","call_id":"call_1","name":"get_weather"})"));
  EXPECT_EQ(out[3]["call_id"], "call_2");

  // Stored: the body for GET, and the conversation (no instructions) with the answer.
  ASSERT_TRUE(writer.stored());
  std::optional<StoredResponse> stored = store.Get("t", "resp_00ff");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->response_json, body);
  ASSERT_EQ(stored->conversation.size(), 2u);
  EXPECT_EQ(stored->conversation[0].Text(), "Weather?");
  const ApiMessage& answer = stored->conversation[1];
  EXPECT_EQ(answer.role, ApiRole::kAssistant);
  EXPECT_EQ(answer.Text(), "Let me check.");
  EXPECT_EQ(answer.reasoning, "Need the tool.");
  ASSERT_EQ(answer.tool_calls.size(), 2u);
  EXPECT_EQ(answer.tool_calls[1].arguments, R"({"city":"Rome"})");
}

TEST(ResponsesWriterTest, StopsAtTheLengthAsIncompleteAndHonoursStoreFalse) {
  ResponseStore store;
  ApiRequest request = Request(R"({"model":"tiny","input":"x","store":false,
                                   "previous_response_id":"resp_prev"})");
  ResponsesWriter writer("resp_1", 5, request, {}, &store, "t");
  const Json j = Json::parse(writer.Full({Answer("cut", "length")}, UsageCounts()));
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["incomplete_details"], Json::parse(R"({"reason":"max_output_tokens"})"));
  EXPECT_EQ(j["output"][0]["status"], "incomplete");
  EXPECT_EQ(j["store"], false);
  EXPECT_EQ(j["previous_response_id"], "resp_prev");
  EXPECT_EQ(j["temperature"].get<double>(), 1.0);
  EXPECT_EQ(j["tool_choice"], "auto");
  EXPECT_EQ(j["tools"], Json::array());
  EXPECT_EQ(j["metadata"], Json::object());
  EXPECT_TRUE(j["user"].is_null());
  EXPECT_FALSE(writer.stored());
  EXPECT_FALSE(store.Get("t", "resp_1").has_value());
  // No store at all: the same body, nothing kept.
  ResponsesWriter none("resp_2", 5, Request(Body("")), {}, nullptr, "t");
  EXPECT_EQ(Json::parse(none.Full({Answer("a")}, UsageCounts()))["output"].size(), 1u);
  EXPECT_FALSE(none.stored());
  // No output at all: an empty list.
  ResponsesWriter empty("resp_3", 5, Request(Body("")), {}, nullptr, "t");
  EXPECT_EQ(Json::parse(empty.Full({Answer("")}, UsageCounts()))["output"], Json::array());
}

struct SseEvent {
  std::string event;
  Json data;
};

// Splits a stream into its events, checking the framing and that every event's name is its type.
std::vector<SseEvent> Events(const std::string& stream) {
  std::vector<SseEvent> events;
  for (absl::string_view block : absl::StrSplit(stream, "\n\n", absl::SkipEmpty())) {
    std::vector<std::string> lines = absl::StrSplit(block, '\n');
    EXPECT_EQ(lines.size(), 2u) << block;
    if (lines.size() != 2 || lines[0].rfind("event: ", 0) != 0 ||
        lines[1].rfind("data: ", 0) != 0) {
      ADD_FAILURE() << "bad event: " << block;
      continue;
    }
    SseEvent e{lines[0].substr(7), Json::parse(lines[1].substr(6))};
    EXPECT_EQ(e.data["type"], e.event);
    events.push_back(std::move(e));
  }
  return events;
}

TEST(ResponsesWriterTest, StreamsReasoningTextAndTwoFunctionCalls) {
  ResponseStore store;
  ApiRequest request = Request(R"({"model":"tiny","input":"Weather?","stream":true,
      "tools":[{"type":"function","name":"get_weather"}]})");
  std::vector<ApiMessage> history;
  ASSERT_TRUE(ResponsesConversation(store, "t", &request, &history).status.ok());
  ResponsesWriter writer("resp_ab", 7, request, history, &store, "t");
  std::string stream = writer.StreamStart(0);
  EXPECT_EQ(writer.StreamStart(1), "");  // one choice only
  ChoiceOutputs d;
  d.reasoning = "Two ";
  stream += writer.StreamDelta(0, d);
  d = ChoiceOutputs();
  d.reasoning = "cities.";
  d.text = "Checking";
  stream += writer.StreamDelta(0, d);
  d = ChoiceOutputs();
  d.text = " both.";
  d.tool_call_deltas = {{0, "call_1", "get_weather", ""}, {0, "", "", R"({"city":)"}};
  stream += writer.StreamDelta(0, d);
  d = ChoiceOutputs();
  d.tool_call_deltas = {{0, "", "", R"("Paris"})"}, {1, "call_2", "get_weather", R"({"city")"}};
  stream += writer.StreamDelta(0, d);
  d = ChoiceOutputs();
  d.tool_call_deltas = {{1, "", "", R"(:"Rome"})"}};
  d.finish_reason = "tool_calls";
  stream += writer.StreamDelta(0, d);
  ChoiceOutputs all;
  all.reasoning = "Two cities.";
  all.text = "Checking both.";
  all.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"},
                    {"call_2", "get_weather", R"({"city":"Rome"})"}};
  all.finish_reason = "tool_calls";
  UsageCounts usage;
  usage.prompt_tokens = 12;
  usage.completion_tokens = 30;
  stream += writer.StreamEnd({all}, usage);
  EXPECT_EQ(writer.StreamEnd({all}, usage), "");
  EXPECT_EQ(writer.StreamError({absl::InternalError("late"), "", ""}, "trace"), "");

  const std::vector<SseEvent> events = Events(stream);
  std::vector<std::string> types;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].data["sequence_number"], i);
    types.push_back(events[i].event);
  }
  const std::vector<std::string> expected = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",  // 0: reasoning
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",  // 1: message
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",  // 2: call_1
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.output_item.added",  // 3: call_2
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
  };
  ASSERT_EQ(types, expected);

  const Json& created = events[0].data["response"];
  EXPECT_EQ(created["status"], "in_progress");
  EXPECT_EQ(created["output"], Json::array());
  EXPECT_TRUE(created["usage"].is_null());
  EXPECT_EQ(events[1].data["response"], created);

  EXPECT_EQ(events[2].data["item"],
            Json::parse(R"({"id":"rs_ab_0","type":"reasoning","summary":[],"content":[]})"));
  EXPECT_EQ(events[3].data["part"], Json::parse(R"({"type":"reasoning_text","text":""})"));
  EXPECT_EQ(events[4].data["delta"], "Two ");
  EXPECT_EQ(events[6].data["text"], "Two cities.");
  EXPECT_EQ(events[7].data["part"]["text"], "Two cities.");
  EXPECT_EQ(events[8].data["item"]["content"][0]["text"], "Two cities.");

  EXPECT_EQ(events[9].data["output_index"], 1);
  EXPECT_EQ(events[9].data["item"], Json::parse(R"({"id":"msg_ab_1","type":"message",
      "status":"in_progress","content":[],"role":"assistant"})"));
  EXPECT_EQ(events[10].data["part"],
            Json::parse(R"({"type":"output_text","text":"","annotations":[]})"));
  EXPECT_EQ(events[11].data["item_id"], "msg_ab_1");
  EXPECT_EQ(events[11].data["content_index"], 0);
  EXPECT_EQ(events[11].data["logprobs"], Json::array());
  EXPECT_EQ(events[13].data["text"], "Checking both.");
  EXPECT_EQ(events[15].data["item"]["status"], "completed");
  EXPECT_EQ(events[15].data["item"]["content"][0]["text"], "Checking both.");

  EXPECT_EQ(events[16].data["item"], Json::parse(R"({"id":"fc_ab_2","type":"function_call",
      "status":"in_progress","arguments":"","call_id":"call_1","name":"get_weather"})"));
  EXPECT_EQ(events[17].data["delta"], R"({"city":)");
  EXPECT_EQ(events[19].data["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(events[20].data["item"]["arguments"], R"({"city":"Paris"})");
  EXPECT_EQ(events[20].data["item"]["status"], "completed");
  EXPECT_EQ(events[21].data["output_index"], 3);
  EXPECT_EQ(events[21].data["item"]["call_id"], "call_2");
  EXPECT_EQ(events[24].data["arguments"], R"({"city":"Rome"})");

  const Json& done = events.back().data["response"];
  EXPECT_EQ(done["status"], "completed");
  EXPECT_EQ(done["usage"]["total_tokens"], 42);
  ASSERT_EQ(done["output"].size(), 4u);
  EXPECT_EQ(done["output"][0], events[8].data["item"]);
  EXPECT_EQ(done["output"][1], events[15].data["item"]);
  EXPECT_EQ(done["output"][2], events[20].data["item"]);
  EXPECT_EQ(done["output"][3], events[25].data["item"]);

  std::optional<StoredResponse> stored = store.Get("t", "resp_ab");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(Json::parse(stored->response_json), done);
  ASSERT_EQ(stored->conversation.size(), 2u);
  EXPECT_EQ(stored->conversation[1].reasoning, "Two cities.");
  EXPECT_EQ(stored->conversation[1].Text(), "Checking both.");
  EXPECT_EQ(stored->conversation[1].tool_calls.size(), 2u);
}

// What the whole answer holds and the deltas did not bring is streamed before the end; a stream
// cut at its length ends with response.incomplete.
TEST(ResponsesWriterTest, StreamEndCatchesUpAndEndsIncompleteAtTheLength) {
  ResponsesWriter writer("resp_c", 7, Request(Body("")), {}, nullptr, "t");
  std::string stream = writer.StreamStart(0);
  ChoiceOutputs d;
  d.text = "Hel";
  stream += writer.StreamDelta(0, d);
  ChoiceOutputs all = Answer("Hello", "length");
  all.tool_calls = {{"call_9", "f", "{}"}};
  stream += writer.StreamEnd({all}, UsageCounts());
  const std::vector<SseEvent> events = Events(stream);
  std::vector<std::string> types;
  for (const SseEvent& e : events) types.push_back(e.event);
  const std::vector<std::string> expected = {
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.incomplete",
  };
  ASSERT_EQ(types, expected);
  EXPECT_EQ(events[5].data["delta"], "lo");
  EXPECT_EQ(events[6].data["text"], "Hello");
  EXPECT_EQ(events[12].data["item"]["status"], "incomplete");
  const Json& response = events.back().data["response"];
  EXPECT_EQ(response["status"], "incomplete");
  EXPECT_EQ(response["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(response["output"][1]["call_id"], "call_9");
}

TEST(ResponsesWriterTest, StreamErrorIsOneErrorEventThenNothing) {
  ResponseStore store;
  ResponsesWriter writer("resp_e", 7, Request(Body("")), {}, &store, "t");
  std::string stream = writer.StreamStart(0);
  ChoiceOutputs d;
  d.text = "partial";
  stream += writer.StreamDelta(0, d);
  const std::string error =
      writer.StreamError({absl::UnavailableError("the worker went away"), "", ""}, "trace-1");
  const std::vector<SseEvent> events = Events(error);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].data, Json::parse(R"({"type":"error","code":"unavailable",
      "message":"the worker went away","param":null,"sequence_number":5})"));
  EXPECT_EQ(writer.StreamDelta(0, d), "");
  EXPECT_EQ(writer.StreamEnd({Answer("partial")}, UsageCounts()), "");
  EXPECT_FALSE(writer.stored());
  EXPECT_FALSE(store.Get("t", "resp_e").has_value());

  ResponsesWriter coded("resp_f", 7, Request(Body("")), {}, nullptr, "t");
  const std::vector<SseEvent> e2 = Events(coded.StreamError(
      {absl::InvalidArgumentError("too long"), "input", "context_length_exceeded"}, ""));
  ASSERT_EQ(e2.size(), 1u);
  EXPECT_EQ(e2[0].data["code"], "context_length_exceeded");
  EXPECT_EQ(e2[0].data["param"], "input");
  EXPECT_EQ(e2[0].data["sequence_number"], 0);
}

}  // namespace
}  // namespace ferry
