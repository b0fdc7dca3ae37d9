// The OpenAI request parser: what it takes (defaults, both spellings of max tokens, stop as a
// string or a list, extensions, developer as system, text parts) and a table of what it refuses,
// each with the field it names; large bodies against the JSON limits, duplicate keys, and tool
// schemas' key order through to the chat template. And the OpenAI writer's token ids
// (return_token_ids): where they go in bodies and stream chunks, and that nothing changes without
// them.

#include "router/api/openai_parser.h"

#include "absl/strings/str_cat.h"
#include "engine/template/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/api/openai_writer.h"
#include "router/api/prompt_builder.h"
#include "router/api/request_json.h"

namespace ferry {
namespace {

ApiLimits Limits() {
  ApiLimits l;
  l.model = "tiny";
  l.vocab_size = 512;
  l.max_n = 4;
  return l;
}

TEST(OpenAiParserTest, ChatRequestsBecomeTheInternalModel) {
  ApiRequest r;
  ApiError e = ParseChatCompletion(R"({
      "model": "tiny",
      "messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                                {"type": "text", "text": "there"}]}],
      "max_completion_tokens": 9, "temperature": 0.5, "top_p": 0.9, "n": 2, "seed": -3,
      "stop": "END", "logprobs": true, "top_logprobs": 3, "logit_bias": {"7": -100},
      "stream": true, "stream_options": {"include_usage": true}, "user": "u1",
      "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "ignore_eos": true,
      "min_tokens": 2, "metadata": {"a": "b"}, "store": false})",
                                   Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0].role, ApiRole::kSystem);
  EXPECT_EQ(r.messages[1].Text(), "Hi there");
  EXPECT_EQ(*r.sampling.max_tokens, 9);
  EXPECT_EQ(r.sampling.n, 2);
  EXPECT_EQ(*r.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.sampling.logprobs);
  EXPECT_EQ(r.sampling.top_logprobs, 3);
  ASSERT_EQ(r.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(r.sampling.logit_bias[0].first, 7u);
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.sampling.top_k, 20);
  EXPECT_TRUE(r.sampling.ignore_eos);
  EXPECT_EQ(r.sampling.min_tokens, 2);

  ApiRequest d;
  ASSERT_TRUE(ParseChatCompletion(R"({"model":"tiny","messages":[{"role":"user","content":"x"}]})",
                                  Limits(), &d)
                  .status.ok());
  EXPECT_FALSE(d.sampling.max_tokens.has_value());
  EXPECT_FALSE(d.sampling.seed.has_value());
  EXPECT_EQ(d.sampling.temperature, 1.0f);
  EXPECT_FALSE(d.stream);
}

// JSON nested past 128 levels is refused as it is parsed (a tool schema of 100,000 levels would
// otherwise overflow the stack when it is copied or dumped).
TEST(OpenAiParserTest, DeeplyNestedJsonIsRefused) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  for (
      const std::string& body :
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":)" +
           deep + "}}}}]}",
       R"({"model":"tiny","metadata":)" + deep + "}"}) {
    ApiRequest r;
    ApiError e = ParseChatCompletion(body, Limits(), &r);
    EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(e.status.message().find("deeper than 128"), std::string::npos) << e.status;
  }
  ApiRequest r;
  EXPECT_TRUE(
      ParseChatCompletion(
          R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"metadata":{"a":[[[[1]]]]}})",
          Limits(), &r)
          .status.ok());
}

// Bodies that are large but within --max_body_bytes parse in linear time within the JSON limits
// (request_json.h): those over a limit are refused with a 400 that names it and where in the body
// it was met, those within it parse and meet the API's own checks.
TEST(OpenAiParserTest, LargeBodiesParseWithinTheJsonLimits) {
  const std::string chat = R"({"model":"tiny","messages":[{"role":"user","content":"x"}])";
  // logit_bias of 300,000 keys (3.5 MB): parsed, then refused by max_logit_bias.
  std::string bias = "{";
  for (int i = 0; i < 300000; ++i) absl::StrAppend(&bias, i ? "," : "", "\"", i, "\":1");
  bias += "}";
  ApiRequest r;
  ApiError e = ParseChatCompletion(chat + ",\"logit_bias\":" + bias + "}", Limits(), &r);
  EXPECT_EQ(e.param, "logit_bias");
  EXPECT_NE(e.status.message().find("300000 entries; at most 1024"), std::string::npos) << e.status;
  // Under a smaller JSON limit, the same body is refused as it is parsed, naming the limit.
  ApiLimits small = Limits();
  small.json = RequestJsonLimits(1 << 20, 0);  // a 1 MiB body: 131,072 keys and elements
  e = ParseChatCompletion(chat + ",\"logit_bias\":" + bias + "}", small, &r);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.param, "logit_bias");
  EXPECT_NE(e.status.message().find("more than 131072 JSON keys and array elements"),
            std::string::npos)
      << e.status;
  EXPECT_NE(e.status.message().find("--max_body_bytes"), std::string::npos) << e.status;

  // A million token ids fit the default limits (1,048,576); two million do not.
  std::string ids = "[";
  for (int i = 0; i < 1000000; ++i) ids += i ? ",7" : "7";
  ApiRequest million;
  ASSERT_TRUE(
      ParseCompletion(R"({"model":"tiny","prompt":)" + ids + "]}", Limits(), &million).status.ok());
  EXPECT_EQ(million.prompt_ids.size(), 1000000u);
  for (int i = 0; i < 1000000; ++i) ids += ",7";
  e = ParseCompletion(R"({"model":"tiny","prompt":[)" + ids + "]]}", Limits(), &r);
  EXPECT_EQ(e.param, "prompt[0]");
  EXPECT_NE(e.status.message().find("more than 1048576 JSON keys"), std::string::npos) << e.status;

  // A string over the limit (the body's bytes) names where it is; one within it is a prompt.
  ApiLimits tight = Limits();
  tight.json = RequestJsonLimits(64 << 10, 0);
  e = ParseChatCompletion(R"({"model":"tiny","messages":[{"role":"user","content":")" +
                              std::string((64 << 10) + 1, 'x') + "\"}]}",
                          tight, &r);
  EXPECT_EQ(e.param, "messages[0].content");
  EXPECT_NE(e.status.message().find("a JSON string longer than 65536 bytes"), std::string::npos)
      << e.status;
  ApiRequest text;
  ASSERT_TRUE(ParseCompletion(R"({"model":"tiny","prompt":")" + std::string(4 << 20, 'x') + "\"}",
                              Limits(), &text)
                  .status.ok());
  EXPECT_EQ(text.prompt_text.size(), size_t{4} << 20);
}

// A prompt of a whole context in token ids parses even where the body limit alone would refuse
// its count (a 512 KiB body: 65,536 keys and elements), once the context is known.
TEST(OpenAiParserTest, AContextOfTokenIdsStaysLegal) {
  constexpr int64_t kContext = 131072;
  std::string body = R"({"model":"tiny","prompt":[[)";
  for (int64_t i = 0; i < kContext; ++i) body += i ? ",1" : "1";
  body += "]]}";
  ASSERT_LE(body.size(), size_t{512} << 10);
  ApiLimits limits = Limits();
  limits.json = RequestJsonLimits(512 << 10, kContext);
  ApiRequest r;
  ApiError e = ParseCompletion(body, limits, &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(r.prompt_ids.size(), static_cast<size_t>(kContext));
  limits.json = RequestJsonLimits(512 << 10, 0);  // context unknown: the body limit's bound
  EXPECT_EQ(ParseCompletion(body, limits, &r).param, "prompt[0]");
}

// Duplicate keys: the last value wins, where the key first stood (as before, and as Python's
// json.loads has it).
TEST(OpenAiParserTest, DuplicateKeysTakeTheLastValue) {
  ApiRequest r;
  ASSERT_TRUE(ParseChatCompletion(R"({"model":"tiny","max_tokens":5,"messages":[{"role":"user",
      "content":"a","content":"b"}],"max_tokens":7,"logit_bias":{"3":1,"3":-2}})",
                                  Limits(), &r)
                  .status.ok());
  EXPECT_EQ(*r.sampling.max_tokens, 7);
  EXPECT_EQ(r.messages[0].Text(), "b");
  ASSERT_EQ(r.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(r.sampling.logit_bias[0].second, -2.0f);
}

// A tool's parameter schema reaches the chat template with its properties in the client's order
// (not sorted), also for schemas with many properties.
TEST(OpenAiParserTest, ToolSchemaPropertiesReachTheTemplateInTheClientsOrder) {
  std::string properties, want_keys;
  for (int i = 0; i < 40; ++i) {
    const std::string name = absl::StrCat("p", (i * 17) % 40);  // p0, p17, p34, p11, ...
    absl::StrAppend(&properties, i ? "," : "", "\"", name, "\":{\"type\":\"string\"}");
    absl::StrAppend(&want_keys, name, ",");
  }
  const std::string body = R"({"model":"tiny","messages":[{"role":"user","content":"x"}],
      "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"zeta":{"type":"integer"},"alpha":{"type":"string"},)" +
                           properties + R"(},"required":["zeta"]}}}]})";
  ApiRequest r;
  ApiError e = ParseChatCompletion(body, Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  auto chat = ChatTemplate::Parse(
      "{% for t in tools %}{% set props = t.function.parameters.properties %}"
      "{% for k in props %}{{ k }},{% endfor %}|{{ props['zeta'].type }}|"
      "{{ t.function.parameters | tojson }}{% endfor %}");
  ASSERT_TRUE(chat.ok()) << chat.status();
  ToolSetup setup;
  setup.format = ToolCallFormat::kHermes;
  auto prompt = (*chat)->Apply(TemplateInputs(r, setup));
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->text.substr(0, prompt->text.find('|')), "zeta,alpha," + want_keys);
  EXPECT_NE(prompt->text.find("|integer|{\"type\": \"object\", \"properties\": {\"zeta\": "),
            std::string::npos)
      << prompt->text.substr(0, 300);
}

TEST(OpenAiParserTest, CompletionsTakeTextOrTokenIds) {
  ApiRequest r;
  ASSERT_TRUE(ParseCompletion(R"({"model":"tiny","prompt":"Once","max_tokens":5,"logprobs":2,
                                  "echo":false,"best_of":1})",
                              Limits(), &r)
                  .status.ok());
  EXPECT_EQ(r.prompt_text, "Once");
  EXPECT_EQ(r.sampling.top_logprobs, 2);
  ApiRequest ids;
  ASSERT_TRUE(
      ParseCompletion(R"({"model":"tiny","prompt":[[5,6,7]]})", Limits(), &ids).status.ok());
  EXPECT_TRUE(ids.prompt_is_ids);
  EXPECT_EQ(ids.prompt_ids, (std::vector<TokenId>{5, 6, 7}));
}

TEST(OpenAiParserTest, ReturnTokenIdsIsABooleanOfBothEndpoints) {
  ApiRequest chat;
  ASSERT_TRUE(ParseChatCompletion(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],
                                      "return_token_ids":true})",
                                  Limits(), &chat)
                  .status.ok());
  EXPECT_TRUE(chat.return_token_ids);
  ApiRequest completion;
  ASSERT_TRUE(
      ParseCompletion(R"({"model":"tiny","prompt":"a","return_token_ids":true,"stream":true})",
                      Limits(), &completion)
          .status.ok());
  EXPECT_TRUE(completion.return_token_ids);
  // Absent, false or null (OpenAI's absent): off.
  for (const char* extra : {"", R"(,"return_token_ids":false)", R"(,"return_token_ids":null)"}) {
    ApiRequest r;
    ASSERT_TRUE(
        ParseCompletion(std::string(R"({"model":"tiny","prompt":"a")") + extra + "}", Limits(), &r)
            .status.ok())
        << extra;
    EXPECT_FALSE(r.return_token_ids) << extra;
  }
  for (const char* value : {"1", "\"true\"", "[]", "{}", "0.5"}) {
    ApiRequest r;
    ApiError e = ParseChatCompletion(
        std::string(R"({"model":"tiny","messages":[{"role":"user","content":"x"}],)") +
            R"("return_token_ids":)" + value + "}",
        Limits(), &r);
    EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_EQ(e.param, "return_token_ids") << value;
    EXPECT_EQ(e.status.message(), "'return_token_ids' must be a boolean") << value;
    ApiRequest c;
    e = ParseCompletion(
        std::string(R"({"model":"tiny","prompt":"a","return_token_ids":)") + value + "}", Limits(),
        &c);
    EXPECT_EQ(e.param, "return_token_ids") << value;
  }
}

struct Bad {
  std::string body;
  const char* param;
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
};

TEST(OpenAiParserTest, BadChatRequestsNameTheirField) {
  const Bad cases[] = {
      {"[1,2]", ""},
      {"not json", ""},
      {R"({"messages":[{"role":"user","content":"x"}]})", "model"},
      {R"({"model":"other","messages":[{"role":"user","content":"x"}]})", "model",
       absl::StatusCode::kNotFound},
      {R"({"model":"tiny"})", "messages"},
      {R"({"model":"tiny","messages":[]})", "messages"},
      {R"({"model":"tiny","messages":"hi"})", "messages"},
      {R"({"model":"tiny","messages":[{"content":"x"}]})", "messages[0].role"},
      {R"({"model":"tiny","messages":[{"role":"wizard","content":"x"}]})", "messages[0].role"},
      {R"({"model":"tiny","messages":[{"role":"user"}]})", "messages[0].content"},
      {R"({"model":"tiny","messages":[{"role":"user","content":5}]})", "messages[0].content"},
      {R"({"model":"tiny","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
       "messages[0].content[0].image_url"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x","colour":"red"}]})",
       "messages[0].colour"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"temperature":3})",
       "temperature"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"temperature":"hot"})",
       "temperature"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"top_p":0})", "top_p"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"n":5})", "n"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"n":1.5})", "n"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":0})",
       "max_tokens"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"presence_penalty":-3})",
       "presence_penalty"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logit_bias":{"999":1}})",
       "logit_bias"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logit_bias":{"x":1}})",
       "logit_bias"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logit_bias":{"5":101}})",
       "logit_bias"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})",
       "stop"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"stop":[""]})", "stop"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"stop":5})", "stop"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
       "top_logprobs"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})",
       "top_logprobs"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}})",
       "stream_options"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       "tools[0].function"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}})",
       "response_format.json_schema.name"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":5}}})",
       "response_format.json_schema.schema"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}})",
       "response_format.type"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object","x":1}})",
       "response_format.x"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},"structured_outputs":{"regex":"a"}})",
       "structured_outputs.regex"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"structured_outputs":{"regex":"a","choice":["b"]}})",
       "structured_outputs.choice"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"structured_outputs":{"choice":[]}})",
       "structured_outputs.choice"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"structured_outputs":{"json":"{nope"}})",
       "structured_outputs.json"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"structured_outputs":{"backend":"xgrammar"}})",
       "structured_outputs.backend"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"guided_regex":"a","guided_choice":["b"]})",
       "guided_choice"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"audio":{}})", "audio"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"temprature":0.5})",
       "temprature"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"stream":"yes"})", "stream"},
      {R"({"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":4,"min_tokens":5})",
       "min_tokens"},
  };
  for (const Bad& c : cases) {
    ApiRequest r;
    const ApiError e = ParseChatCompletion(c.body, Limits(), &r);
    EXPECT_EQ(e.status.code(), c.code) << c.body << ": " << e.status;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_FALSE(e.status.message().empty());
  }
}

TEST(OpenAiParserTest, StructuredOutputFormsBecomeTheInternalModel) {
  const std::string chat = R"({"model":"tiny","messages":[{"role":"user","content":"x"}],)";
  ApiRequest r;
  ASSERT_TRUE(ParseChatCompletion(chat + R"("response_format":{"type":"text"}})", Limits(), &r)
                  .status.ok());
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kText);

  r = ApiRequest();
  ASSERT_TRUE(
      ParseChatCompletion(chat + R"("response_format":{"type":"json_object"}})", Limits(), &r)
          .status.ok());
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kJsonObject);
  EXPECT_EQ(r.output_format.param, "response_format");

  r = ApiRequest();
  const ApiError e = ParseChatCompletion(
      chat +
          R"("response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,
             "schema":{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}}}}}})",
      Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status;
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kJsonSchema);
  EXPECT_EQ(r.output_format.name, "person");
  EXPECT_TRUE(r.output_format.strict);
  EXPECT_EQ(r.output_format.param, "response_format.json_schema.schema");
  // The client's property order is kept: it is the order the grammar asks for.
  EXPECT_EQ(r.output_format.schema["properties"].begin().key(), "b");

  r = ApiRequest();
  ASSERT_TRUE(
      ParseChatCompletion(chat + R"("structured_outputs":{"choice":["yes","no"]}})", Limits(), &r)
          .status.ok());
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kChoice);
  EXPECT_EQ(r.output_format.choices, (std::vector<std::string>{"yes", "no"}));

  // vLLM's json form takes the schema as an object or as its text; the completions endpoint
  // takes it too; the older guided_* names are the same forms.
  r = ApiRequest();
  ASSERT_TRUE(
      ParseCompletion(
          R"({"model":"tiny","prompt":"x","structured_outputs":{"json":"{\"type\":\"integer\"}"}})",
          Limits(), &r)
          .status.ok());
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kJsonSchema);
  EXPECT_EQ(r.output_format.schema, nlohmann::ordered_json({{"type", "integer"}}));
  r = ApiRequest();
  ASSERT_TRUE(ParseChatCompletion(chat + R"("guided_regex":"[0-9]+"})", Limits(), &r).status.ok());
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kRegex);
  EXPECT_EQ(r.output_format.text, "[0-9]+");
  EXPECT_EQ(r.output_format.param, "guided_regex");
  r = ApiRequest();
  ASSERT_TRUE(ParseChatCompletion(chat + R"("structured_outputs":{"grammar":"root ::= \"a\""}})",
                                  Limits(), &r)
                  .status.ok());
  EXPECT_EQ(r.output_format.kind, ApiOutputFormat::Kind::kGrammar);
  EXPECT_EQ(r.output_format.text, "root ::= \"a\"");
}

TEST(OpenAiParserTest, ToolsToolCallsAndResultsBecomeTheInternalModel) {
  ApiRequest r;
  ApiError e = ParseChatCompletion(R"({
      "model": "tiny",
      "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "reasoning_content": "I should look.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22 degrees"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}, "strict": true}}],
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "parallel_tool_calls": false})",
                                   Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  ASSERT_EQ(r.messages.size(), 3u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(r.messages[1].reasoning, "I should look.");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].parameters["required"][0], "city");
  EXPECT_EQ(r.tool_choice.mode, ApiToolChoice::Mode::kFunction);
  EXPECT_EQ(r.tool_choice.function, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
}

TEST(OpenAiParserTest, BadToolRequestsNameTheirField) {
  const std::string m = R"("model":"tiny","messages":[{"role":"user","content":"x"}])";
  const std::string f =
      R"({"type":"function","function":{"name":"f","parameters":{"type":"object"}}})";
  const Bad cases[] = {
      {"{" + m + R"(,"tools":{}})", "tools"},
      {"{" + m + R"(,"tools":[{"type":"retrieval"}]})", "tools[0].type"},
      {"{" + m + R"(,"tools":[{"type":"function","function":{"name":"bad name"}}]})",
       "tools[0].function.name"},
      {"{" + m + R"(,"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]})",
       "tools[0].function.parameters"},
      {"{" + m +
           R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":5}}}]})",
       "tools[0].function.parameters.type"},
      {"{" + m + ",\"tools\":[" + f + "," + f + "]}", "tools[1].function.name"},
      {"{" + m + ",\"tools\":[" + f + R"(],"tool_choice":"sometimes"})", "tool_choice"},
      {"{" + m + ",\"tools\":[" + f +
           R"(],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice"},
      {"{" + m + R"(,"tool_choice":"required"})", "tool_choice"},
      {"{" + m + ",\"tools\":[" + f + R"(],"parallel_tool_calls":"yes"})", "parallel_tool_calls"},
      {R"({"model":"tiny","messages":[{"role":"tool","content":"r"}]})",
       "messages[0].tool_call_id"},
      {R"({"model":"tiny","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f"}}]}]})",
       "messages[0].tool_calls[0].id"},
      {R"({"model":"tiny","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]}]})",
       "messages[0].tool_calls[0].function.arguments"},
  };
  for (const Bad& c : cases) {
    ApiRequest r;
    const ApiError e = ParseChatCompletion(c.body, Limits(), &r);
    EXPECT_EQ(e.status.code(), c.code) << c.body << ": " << e.status;
    EXPECT_EQ(e.param, c.param) << c.body;
  }
  // Too many, too large.
  std::string many = "{" + m + ",\"tools\":[";
  for (int i = 0; i < 129; ++i) {
    many += (i ? "," : "") + std::string(R"({"type":"function","function":{"name":"f)") +
            std::to_string(i) + "\"}}";
  }
  ApiRequest r;
  EXPECT_EQ(ParseChatCompletion(many + "]}", Limits(), &r).param, "tools");
  const std::string big = "{" + m +
                          R"(,"tools":[{"type":"function","function":{"name":"f","description":")" +
                          std::string(300 << 10, 'x') + "\"}}]}";
  ApiRequest r2;
  EXPECT_EQ(ParseChatCompletion(big, Limits(), &r2).param, "tools");
}

TEST(OpenAiParserTest, BadCompletionRequestsNameTheirField) {
  const Bad cases[] = {
      {R"({"model":"tiny"})", "prompt"},
      {R"({"model":"tiny","prompt":""})", "prompt"},
      {R"({"model":"tiny","prompt":[]})", "prompt"},
      {R"({"model":"tiny","prompt":["a","b"]})", "prompt"},
      {R"({"model":"tiny","prompt":[1,2,9999]})", "prompt"},
      {R"({"model":"tiny","prompt":{"text":"a"}})", "prompt"},
      {R"({"model":"tiny","prompt":"a","logprobs":6})", "logprobs"},
      {R"({"model":"tiny","prompt":"a","echo":true,"logprobs":1})", "echo"},
      {R"({"model":"tiny","prompt":"a","best_of":3})", "best_of"},
      {R"({"model":"tiny","prompt":"a","suffix":"z"})", "suffix"},
  };
  for (const Bad& c : cases) {
    ApiRequest r;
    const ApiError e = ParseCompletion(c.body, Limits(), &r);
    EXPECT_EQ(e.status.code(), c.code) << c.body << ": " << e.status;
    EXPECT_EQ(e.param, c.param) << c.body;
  }
}

ResponseHeader Header(ApiKind kind) {
  ResponseHeader h;
  h.kind = kind;
  h.id = kind == ApiKind::kChatCompletion ? "chatcmpl-1" : "cmpl-1";
  h.created = 1700000000;
  h.model = "tiny";
  h.system_fingerprint = "fp_0";
  return h;
}

ChoiceOutputs Tokens(const std::string& text, std::vector<TokenId> tokens,
                     const std::string& finish = "") {
  ChoiceOutputs c;
  c.text = text;
  c.tokens = std::move(tokens);
  c.finish_reason = finish;
  return c;
}

// One SSE event's JSON ("data: {...}\n\n").
nlohmann::json Event(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n") << event;
  return nlohmann::json::parse(event.substr(6, event.size() - 8));
}

TEST(OpenAiWriterTest, TokenIdsOnEveryChoiceOfTheWholeAnswer) {
  const std::vector<TokenId> prompt = {1, 20, 30};
  const std::vector<ChoiceOutputs> choices = {Tokens("Hi!", {7, 8, 2}, "stop"),
                                              Tokens("Yo", {9}, "length")};
  UsageCounts usage;
  usage.prompt_tokens = 3;
  usage.completion_tokens = 4;
  for (ApiKind kind : {ApiKind::kChatCompletion, ApiKind::kCompletion}) {
    OpenAiWriter writer(Header(kind), nullptr, false, "", false, true, prompt);
    const nlohmann::json j = nlohmann::json::parse(writer.Full(choices, usage));
    ASSERT_EQ(j["choices"].size(), 2u);
    EXPECT_EQ(j["choices"][0]["token_ids"], nlohmann::json::array({7, 8, 2}));
    EXPECT_EQ(j["choices"][1]["token_ids"], nlohmann::json::array({9}));
    for (const auto& c : j["choices"]) {
      EXPECT_EQ(c["prompt_token_ids"], nlohmann::json::array({1, 20, 30}));
    }
    EXPECT_FALSE(j.contains("prompt_token_ids"));
    EXPECT_EQ(j["usage"]["completion_tokens"], 4);
    // Without the extension the body has neither field.
    OpenAiWriter plain(Header(kind), nullptr, false);
    const std::string body = plain.Full(choices, usage);
    EXPECT_EQ(body.find("token_ids"), std::string::npos) << body;
  }
  // The fields follow finish_reason in each choice.
  OpenAiWriter writer(Header(ApiKind::kCompletion), nullptr, false, "", false, true, {5});
  EXPECT_NE(writer.Full({Tokens("a", {6}, "stop")}, usage)
                .find(R"("finish_reason":"stop","token_ids":[6],"prompt_token_ids":[5]})"),
            std::string::npos);
}

TEST(OpenAiWriterTest, StreamedTokenIdsConcatenateToTheWholeAnswers) {
  const std::vector<TokenId> prompt = {1, 20, 30};
  for (ApiKind kind : {ApiKind::kChatCompletion, ApiKind::kCompletion}) {
    OpenAiWriter writer(Header(kind), nullptr, false, "", true, true, prompt);
    const nlohmann::json start = Event(writer.StreamStart(0));
    ASSERT_EQ(start["choices"].size(), 1u);
    EXPECT_EQ(start["choices"][0]["prompt_token_ids"], nlohmann::json::array({1, 20, 30}));
    EXPECT_EQ(start["choices"][0]["token_ids"], nlohmann::json::array());
    EXPECT_TRUE(start["usage"].is_null());
    if (kind == ApiKind::kCompletion) {
      EXPECT_EQ(start["choices"][0]["text"], "");
    }
    // A chunk whose text was held (ids only), one with text, the last with a stop token.
    std::vector<TokenId> streamed;
    for (const ChoiceOutputs& d :
         {Tokens("", {7}), Tokens("Hi", {8}), Tokens("!", {9, 2}, "stop")}) {
      const nlohmann::json j = Event(writer.StreamDelta(0, d));
      const nlohmann::json& c = j["choices"][0];
      EXPECT_FALSE(c.contains("prompt_token_ids"));
      for (const auto& id : c["token_ids"]) streamed.push_back(id.get<TokenId>());
      if (kind == ApiKind::kChatCompletion) {
        EXPECT_EQ(c["delta"].value("content", ""), d.text);
      } else {
        EXPECT_EQ(c["text"], d.text);
      }
    }
    EXPECT_EQ(streamed, (std::vector<TokenId>{7, 8, 9, 2}));
    EXPECT_EQ(writer.StreamEnd({}, UsageCounts()).find("token_ids"), std::string::npos);
  }
  // Without the extension: no ids, and completions still start with nothing.
  OpenAiWriter chat(Header(ApiKind::kChatCompletion), nullptr, false);
  EXPECT_EQ(chat.StreamStart(0).find("token_ids"), std::string::npos);
  EXPECT_EQ(chat.StreamDelta(0, Tokens("Hi", {8})).find("token_ids"), std::string::npos);
  OpenAiWriter completion(Header(ApiKind::kCompletion), nullptr, false);
  EXPECT_EQ(completion.StreamStart(0), "");
  EXPECT_EQ(completion.StreamDelta(0, Tokens("Hi", {8})).find("token_ids"), std::string::npos);
  // With echo, the echoed prompt's chunk is the one with the prompt's ids.
  OpenAiWriter echo(Header(ApiKind::kCompletion), nullptr, false, "Once", false, true, {4, 5});
  const nlohmann::json j = Event(echo.StreamStart(0));
  EXPECT_EQ(j["choices"][0]["text"], "Once");
  EXPECT_EQ(j["choices"][0]["prompt_token_ids"], nlohmann::json::array({4, 5}));
}

}  // namespace
}  // namespace ferry
