// ferry-router against malformed and hostile clients (ARCHITECTURE.md §8), with short limits
// configured for the test, in front of a null-engine worker (the default model's tokenizer and
// context, no weights): a table of bad requests, each answered with its 4xx and an OpenAI-shaped
// error body naming the field and the trace id, before any worker sees it; oversized headers and
// bodies; a slow-loris client, a flood of connections and a client that never reads its stream
// are cut off (the stream's request aborted on the worker); and afterwards a normal request still
// works.

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/read.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::string g_router, g_worker;

struct Reply {
  int status = -1;
  std::string body;
  std::map<std::string, std::string> headers;
};

// One request on a fresh connection.
Reply Send(int port, const std::string& method, const std::string& target, const std::string& body,
           const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  asio::io_context io;
  tcp::socket socket(io);
  beast::error_code ec;
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)}, ec);
  Reply reply;
  if (ec) return reply;
  http::request<http::string_body> request(http::string_to_verb(method), target, 11);
  request.set(http::field::host, "127.0.0.1");
  request.set(http::field::content_type, "application/json");
  for (const auto& [k, v] : headers) request.set(k, v);
  request.body() = body;
  request.prepare_payload();
  http::write(socket, request, ec);
  if (ec) return reply;
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(socket, buffer, response, ec);
  if (ec) return reply;
  reply.status = response.result_int();
  reply.body = response.body();
  for (const auto& f : response)
    reply.headers[std::string(f.name_string())] = std::string(f.value());
  return reply;
}

// Waits until `fd` has bytes to read or was closed (true), or `deadline` passes (false).
bool WaitReadable(int fd, absl::Time deadline) {
  while (true) {
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return false;
    pollfd p = {fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return false;
  }
}

// Raw bytes on a fresh connection; what comes back until the server closes (or `wait` passes).
std::string SendRaw(int port, const std::string& bytes, absl::Duration wait = absl::Seconds(10)) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)});
  asio::write(socket, asio::buffer(bytes));
  std::string out;
  const absl::Time deadline = absl::Now() + wait;
  char buf[4096];
  socket.non_blocking(true);
  // Until the server closes: each read waits in poll(2) for bytes or the close.
  while (WaitReadable(socket.native_handle(), deadline)) {
    beast::error_code ec;
    const size_t n = socket.read_some(asio::buffer(buf), ec);
    if (ec == asio::error::would_block) continue;
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

// Waits (up to 10 s) for the router's /readyz, which turns 200 once it watches a worker that is
// up: "ready" on stdout only means it listens.
bool SeesAWorker(const ServiceProcess& router) {
  for (int i = 0; i < 500; ++i) {
    if (HttpGet(router.admin_port(), "/readyz") == 200) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

class RouterBadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* model = std::getenv("FERRY_MODEL_GGUF");
    ASSERT_NE(model, nullptr) << "FERRY_MODEL_GGUF is not set; run through ./ferry test";
    worker_ = new ServiceProcess(
        g_worker, {absl::StrCat("--model=", model), "--engine=null", "--null_token_seconds=0",
                   "--kv_pool_bytes=64MiB", "--block_tokens=16", "--max_n=16"});
    ASSERT_TRUE(worker_->ready()) << worker_->LogTail();
    router_ = new ServiceProcess(
        g_router, {absl::StrCat("--model=", model), "--served_model_name=smol",
                   absl::StrCat("--workers=127.0.0.1:", worker_->grpc_port()), "--read_timeout=1s",
                   "--idle_timeout=2s", "--write_timeout=1s", "--max_connections=16",
                   "--max_body_bytes=128KiB", "--max_header_bytes=4KiB",
                   "--max_stream_buffer_bytes=32KiB", "--threads=2", "--max_tools_bytes=8KiB"});
    ASSERT_TRUE(router_->ready()) << router_->LogTail();
    ASSERT_TRUE(SeesAWorker(*router_)) << router_->LogTail();
  }
  static void TearDownTestSuite() {
    delete router_;
    delete worker_;
  }
  int port() const { return router_->grpc_port(); }

  void ExpectWorks() {
    const Reply r =
        Send(port(), "POST", "/v1/chat/completions",
             R"({"model":"smol","messages":[{"role":"user","content":"hi"}],"max_tokens":3})");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(nlohmann::json::parse(r.body)["usage"]["completion_tokens"], 3);
  }

  static ServiceProcess* router_;
  static ServiceProcess* worker_;
};

ServiceProcess* RouterBadInputTest::router_ = nullptr;
ServiceProcess* RouterBadInputTest::worker_ = nullptr;

struct Case {
  std::string name;
  std::string method, path, body;
  int status;
  std::string param;  // expected "param" of the error ("" = null or not checked)
};

std::string Chat(const std::string& extra) {
  return absl::StrCat(R"({"model":"smol","messages":[{"role":"user","content":"hi"}])", extra, "}");
}
std::string Completion(const std::string& extra) {
  return absl::StrCat(R"({"model":"smol")", extra, "}");
}

TEST_F(RouterBadInputTest, EveryBadRequestGetsItsStatusAndAnOpenAiErrorBody) {
  std::string many_ids = "[";
  for (int i = 0; i < 9000; ++i) absl::StrAppend(&many_ids, i == 0 ? "" : ",", 100 + i % 1000);
  many_ids += "]";
  std::string many_bias = "{";
  for (int i = 0; i < 1100; ++i) absl::StrAppend(&many_bias, i == 0 ? "" : ",", "\"", i, "\":1");
  many_bias += "}";
  const std::string kTool =
      R"({"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}})";
  std::string many_tools = "[";
  for (int i = 0; i < 129; ++i) {
    absl::StrAppend(&many_tools, i == 0 ? "" : ",", R"({"type":"function","function":{"name":"f)",
                    i, "\"}}");
  }
  many_tools += "]";
  // A schema nested past the compiler's depth (64) while its JSON stays within the body's (128).
  std::string deep_schema;
  for (int i = 0; i < 70; ++i) deep_schema += R"({"items":)";
  deep_schema += "{}" + std::string(70, '}');
  const std::vector<Case> cases = {
      {"not an object", "POST", "/v1/chat/completions", "[1,2,3]", 400, ""},
      {"not json", "POST", "/v1/chat/completions", "{model: smol}", 400, ""},
      {"empty body", "POST", "/v1/chat/completions", "", 400, ""},
      {"invalid utf-8", "POST", "/v1/chat/completions",
       "{\"model\":\"smol\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, ""},
      {"no model", "POST", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}]})", 400, "model"},
      {"unknown model", "POST", "/v1/chat/completions",
       R"({"model":"gpt-5","messages":[{"role":"user","content":"x"}]})", 404, "model"},
      {"no messages", "POST", "/v1/chat/completions", R"({"model":"smol"})", 400, "messages"},
      {"empty messages", "POST", "/v1/chat/completions", R"({"model":"smol","messages":[]})", 400,
       "messages"},
      {"bad role", "POST", "/v1/chat/completions",
       R"({"model":"smol","messages":[{"role":"root","content":"x"}]})", 400, "messages[0].role"},
      {"content a number", "POST", "/v1/chat/completions",
       R"({"model":"smol","messages":[{"role":"user","content":7}]})", 400, "messages[0].content"},
      {"image part", "POST", "/v1/chat/completions",
       R"({"model":"smol","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]})",
       400, "messages[0].content[0].image_url"},
      // A valid PNG (2x2) to SmolLM2, a text-only model.
      {"image to a text-only model", "POST", "/v1/chat/completions",
       R"({"model":"smol","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGNocFAAIgYIBQAaDgOBnA45xwAAAABJRU5ErkJggg=="}},{"type":"text","text":"What is it?"}]}]})",
       400, "messages"},
      {"temperature too high", "POST", "/v1/chat/completions", Chat(R"(,"temperature":2.5)"), 400,
       "temperature"},
      {"temperature a string", "POST", "/v1/chat/completions", Chat(R"(,"temperature":"warm")"),
       400, "temperature"},
      {"top_p zero", "POST", "/v1/chat/completions", Chat(R"(,"top_p":0)"), 400, "top_p"},
      {"n too large", "POST", "/v1/chat/completions", Chat(R"(,"n":64)"), 400, "n"},
      {"n fractional", "POST", "/v1/chat/completions", Chat(R"(,"n":1.5)"), 400, "n"},
      {"max_tokens zero", "POST", "/v1/chat/completions", Chat(R"(,"max_tokens":0)"), 400,
       "max_tokens"},
      {"max_tokens past the context", "POST", "/v1/chat/completions",
       Chat(R"(,"max_tokens":100000)"), 400, "max_tokens"},
      {"prompt past the context", "POST", "/v1/completions",
       Completion(absl::StrCat(R"(,"prompt":)", many_ids)), 400, "prompt"},
      {"logit_bias id outside the vocabulary", "POST", "/v1/chat/completions",
       Chat(R"(,"logit_bias":{"99999999":5})"), 400, "logit_bias"},
      {"logit_bias too strong", "POST", "/v1/chat/completions", Chat(R"(,"logit_bias":{"5":500})"),
       400, "logit_bias"},
      {"logit_bias too many", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"logit_bias":)", many_bias)), 400, "logit_bias"},
      {"too many stops", "POST", "/v1/chat/completions",
       Chat(
           R"(,"stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"])"),
       400, "stop"},
      {"stop too long", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"stop":[")", std::string(300, 'x'), R"("])")), 400, "stop"},
      {"top_logprobs without logprobs", "POST", "/v1/chat/completions",
       Chat(R"(,"top_logprobs":3)"), 400, "top_logprobs"},
      {"top_logprobs too many", "POST", "/v1/chat/completions",
       Chat(R"(,"logprobs":true,"top_logprobs":50)"), 400, "top_logprobs"},
      // Tools: SmolLM2's template has no tool format (and the router was given no tool prompt).
      {"tools on a template without a tool format", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"tools":[)", kTool, "]")), 400, "tools"},
      {"tools not a list", "POST", "/v1/chat/completions", Chat(R"(,"tools":{"f":1})"), 400,
       "tools"},
      {"tool of another type", "POST", "/v1/chat/completions",
       Chat(R"(,"tools":[{"type":"code_interpreter"}])"), 400, "tools[0].type"},
      {"tool without a function", "POST", "/v1/chat/completions",
       Chat(R"(,"tools":[{"type":"function"}])"), 400, "tools[0].function"},
      {"function name with spaces", "POST", "/v1/chat/completions",
       Chat(R"(,"tools":[{"type":"function","function":{"name":"get weather"}}])"), 400,
       "tools[0].function.name"},
      {"schema not an object", "POST", "/v1/chat/completions",
       Chat(R"(,"tools":[{"type":"function","function":{"name":"f","parameters":"object"}}])"), 400,
       "tools[0].function.parameters"},
      {"schema type a number", "POST", "/v1/chat/completions",
       Chat(R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":3}}}])"),
       400, "tools[0].function.parameters.type"},
      {"schema properties a list", "POST", "/v1/chat/completions",
       Chat(
           R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":[]}}}])"),
       400, "tools[0].function.parameters.properties"},
      {"schema required not strings", "POST", "/v1/chat/completions",
       Chat(
           R"(,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","required":[1]}}}])"),
       400, "tools[0].function.parameters.required"},
      {"two tools of one name", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"tools":[)", kTool, ",", kTool, "]")), 400, "tools[1].function.name"},
      {"tool_choice names an unknown function", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"tools":[)", kTool,
                         R"(],"tool_choice":{"type":"function","function":{"name":"nope"}})")),
       400, "tool_choice"},
      {"tool_choice an unknown mode", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"tools":[)", kTool, R"(],"tool_choice":"always")")), 400,
       "tool_choice"},
      {"tool_choice without tools", "POST", "/v1/chat/completions",
       Chat(R"(,"tool_choice":"required")"), 400, "tool_choice"},
      {"too many tools", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"tools":)", many_tools)), 400, "tools"},
      {"oversized tool definitions", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"tools":[{"type":"function","function":{"name":"f","description":")",
                         std::string(10 << 10, 'd'), R"("}}])")),
       400, "tools"},
      {"parallel_tool_calls a string", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(R"(,"tools":[)", kTool, R"(],"parallel_tool_calls":"yes")")), 400,
       "parallel_tool_calls"},
      {"tool result without its call id", "POST", "/v1/chat/completions",
       R"({"model":"smol","messages":[{"role":"user","content":"x"},{"role":"tool","content":"r"}]})",
       400, "messages[1].tool_call_id"},
      {"tool call arguments an object", "POST", "/v1/chat/completions",
       R"({"model":"smol","messages":[{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}}]}]})",
       400, "messages[0].tool_calls[0].function.arguments"},
      {"tool call without an id", "POST", "/v1/chat/completions",
       R"({"model":"smol","messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{}"}}]}]})",
       400, "messages[0].tool_calls[0].id"},
      {"deprecated functions", "POST", "/v1/chat/completions",
       Chat(R"(,"functions":[{"name":"f"}])"), 400, "functions"},
      // Structured output the grammar compiler cannot enforce: a 400 before any worker sees it.
      {"a json schema with a backreference pattern", "POST", "/v1/chat/completions",
       Chat(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":
             {"type":"object","properties":{"a":{"type":"string","pattern":"(a)\\1"}}}}})"),
       400, "response_format.json_schema.schema"},
      {"a json schema with 'not'", "POST", "/v1/chat/completions",
       Chat(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":
             {"not":{"type":"string"}}}})"),
       400, "response_format.json_schema.schema"},
      {"a regex with lookahead", "POST", "/v1/chat/completions",
       Chat(R"x(,"structured_outputs":{"regex":"a(?=b)"})x"), 400, "structured_outputs.regex"},
      {"a grammar without root", "POST", "/v1/completions",
       R"({"model":"smol","prompt":"x","structured_outputs":{"grammar":"start ::= \"a\""}})", 400,
       "structured_outputs.grammar"},
      {"a left-recursive grammar", "POST", "/v1/chat/completions",
       Chat(R"(,"guided_grammar":"root ::= root \"a\" | \"b\"")"), 400, "guided_grammar"},
      {"a schema nested past the limit", "POST", "/v1/chat/completions",
       Chat(absl::StrCat(
           R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":)",
           deep_schema, "}}")),
       400, "response_format.json_schema.schema"},
      {"unknown field", "POST", "/v1/chat/completions", Chat(R"(,"temprature":0.2)"), 400,
       "temprature"},
      {"stream_options without stream", "POST", "/v1/chat/completions",
       Chat(R"(,"stream_options":{"include_usage":true})"), 400, "stream_options"},
      {"presence_penalty too low", "POST", "/v1/chat/completions",
       Chat(R"(,"presence_penalty":-7)"), 400, "presence_penalty"},
      {"min_tokens above max_tokens", "POST", "/v1/chat/completions",
       Chat(R"(,"max_tokens":2,"min_tokens":5)"), 400, "min_tokens"},
      {"seed a string", "POST", "/v1/chat/completions", Chat(R"(,"seed":"lucky")"), 400, "seed"},
      {"completions: empty prompt", "POST", "/v1/completions", Completion(R"(,"prompt":"")"), 400,
       "prompt"},
      {"completions: several prompts", "POST", "/v1/completions",
       Completion(R"(,"prompt":["a","b"])"), 400, "prompt"},
      {"completions: token id outside the vocabulary", "POST", "/v1/completions",
       Completion(R"(,"prompt":[1,2,99999999])"), 400, "prompt"},
      {"completions: logprobs too many", "POST", "/v1/completions",
       Completion(R"(,"prompt":"a","logprobs":9)"), 400, "logprobs"},
      {"completions: suffix", "POST", "/v1/completions",
       Completion(R"(,"prompt":"a","suffix":"z")"), 400, "suffix"},
      {"completions: no prompt", "POST", "/v1/completions", Completion(""), 400, "prompt"},
      {"GET on chat completions", "GET", "/v1/chat/completions", "", 405, ""},
      {"unknown path", "POST", "/v1/embeddings", "{}", 404, ""},
      {"unknown model id", "GET", "/v1/models/llama", "", 404, ""},
  };
  ASSERT_GE(cases.size(), 60u);
  for (const Case& c : cases) {
    const Reply r = Send(port(), c.method, c.path, c.body, {{"x-request-id", "bad-input-1"}});
    ASSERT_EQ(r.status, c.status) << c.name << ": " << r.body;
    nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << c.name << ": " << r.body;
    const nlohmann::json& e = body["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << c.name;
    EXPECT_TRUE(e["type"].is_string()) << c.name;
    EXPECT_TRUE(e.contains("param") && e.contains("code")) << c.name;
    EXPECT_EQ(e["trace_id"], "bad-input-1") << c.name;
    if (!c.param.empty()) {
      EXPECT_EQ(e["param"], c.param) << c.name << ": " << r.body;
    }
    EXPECT_EQ(r.headers.count("x-request-id") ? r.headers.at("x-request-id") : "", "bad-input-1")
        << c.name;
  }
  // None of them reached the worker.
  EXPECT_EQ(
      MetricValue(worker_->admin_port(), "ferry_worker_requests_total{outcome=\"completed\"}"), 0);
  ExpectWorks();
}

std::string Messages(const std::string& extra) {
  return absl::StrCat(
      R"({"model":"smol","max_tokens":5,"messages":[{"role":"user","content":"hi"}])", extra, "}");
}
std::string Responses(const std::string& extra) {
  return absl::StrCat(R"({"model":"smol","input":"hi")", extra, "}");
}

// Anthropic Messages and OpenAI Responses: each bad request gets its status and its API's error
// body (Anthropic's {"type":"error","error":{"type","message"},"request_id"} on /v1/messages,
// OpenAI's on /v1/responses), before any worker sees it.
TEST_F(RouterBadInputTest, EveryBadMessagesOrResponsesRequestGetsItsApisErrorShape) {
  const double completed_before =
      MetricValue(worker_->admin_port(), "ferry_worker_requests_total{outcome=\"completed\"}");
  const std::vector<std::pair<std::string, std::string>> version = {
      {"anthropic-version", "2023-06-01"}};
  std::string five_breakpoints;
  for (int i = 0; i < 5; ++i) {
    absl::StrAppend(&five_breakpoints, i == 0 ? "" : ",",
                    R"({"type":"text","text":"s","cache_control":{"type":"ephemeral"}})");
  }
  std::string many_metadata = "{";
  for (int i = 0; i < 17; ++i) absl::StrAppend(&many_metadata, i ? "," : "", "\"k", i, "\":\"v\"");
  many_metadata += "}";
  const std::vector<Case> messages = {
      {"messages: not json", "POST", "/v1/messages", "{model: smol}", 400, ""},
      {"messages: no max_tokens", "POST", "/v1/messages",
       R"({"model":"smol","messages":[{"role":"user","content":"hi"}]})", 400, ""},
      {"messages: max_tokens zero", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":0,"messages":[{"role":"user","content":"hi"}]})", 400, ""},
      {"messages: no messages", "POST", "/v1/messages", R"({"model":"smol","max_tokens":5})", 400,
       ""},
      {"messages: empty messages", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":5,"messages":[]})", 400, ""},
      {"messages: a tool role in messages", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":5,"messages":[{"role":"tool","content":"x"}]})", 400, ""},
      {"messages: content a number", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":5,"messages":[{"role":"user","content":7}]})", 400, ""},
      {"messages: an image block", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]})",
       400, ""},
      {"messages: an unknown block type", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":5,"messages":[{"role":"user","content":[{"type":"hologram"}]}]})",
       400, ""},
      {"messages: tool_use from the user", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]}]})",
       400, ""},
      {"messages: tool_result from the assistant", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t1","content":"r"}]}]})",
       400, ""},
      {"messages: temperature above 1", "POST", "/v1/messages", Messages(R"(,"temperature":1.5)"),
       400, ""},
      {"messages: top_k negative", "POST", "/v1/messages", Messages(R"(,"top_k":-1)"), 400, ""},
      {"messages: stop_sequences a string", "POST", "/v1/messages",
       Messages(R"(,"stop_sequences":"END")"), 400, ""},
      {"messages: an unknown field", "POST", "/v1/messages", Messages(R"(,"temprature":0.2)"), 400,
       ""},
      {"messages: an unknown model", "POST", "/v1/messages",
       R"({"model":"claude-opus-4","max_tokens":5,"messages":[{"role":"user","content":"hi"}]})",
       404, ""},
      {"messages: a cache_control ttl of 2h", "POST", "/v1/messages",
       Messages(
           R"(,"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral","ttl":"2h"}}])"),
       400, ""},
      {"messages: five cache_control blocks", "POST", "/v1/messages",
       Messages(absl::StrCat(R"(,"system":[)", five_breakpoints, "]")), 400, ""},
      {"messages: a server tool", "POST", "/v1/messages",
       Messages(R"(,"tools":[{"type":"web_search_20250305","name":"web_search"}])"), 400, ""},
      {"messages: tools on a template without a tool format", "POST", "/v1/messages",
       Messages(R"(,"tools":[{"name":"f","input_schema":{"type":"object","properties":{}}}])"), 400,
       ""},
      {"messages: a thinking budget under 1024", "POST", "/v1/messages",
       R"({"model":"smol","max_tokens":2000,"thinking":{"type":"enabled","budget_tokens":100},"messages":[{"role":"user","content":"hi"}]})",
       400, ""},
      {"messages: system a number", "POST", "/v1/messages", Messages(R"(,"system":3)"), 400, ""},
      {"messages: metadata a list", "POST", "/v1/messages", Messages(R"(,"metadata":[1])"), 400,
       ""},
      {"messages: GET", "GET", "/v1/messages", "", 405, ""},
      {"count_tokens: no messages", "POST", "/v1/messages/count_tokens", R"({"model":"smol"})", 400,
       ""},
  };
  for (const Case& c : messages) {
    std::vector<std::pair<std::string, std::string>> headers = version;
    headers.emplace_back("x-request-id", "bad-messages-1");
    const Reply r = Send(port(), c.method, c.path, c.body, headers);
    ASSERT_EQ(r.status, c.status) << c.name << ": " << r.body;
    nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.is_object()) << c.name << ": " << r.body;
    EXPECT_EQ(body["type"], "error") << c.name << ": " << r.body;
    EXPECT_EQ(body["request_id"], "bad-messages-1") << c.name;
    ASSERT_TRUE(body["error"].is_object()) << c.name << ": " << r.body;
    if (c.status != 405) {
      EXPECT_EQ(body["error"]["type"],
                c.status == 404 ? "not_found_error" : "invalid_request_error")
          << c.name;
    }
    EXPECT_TRUE(body["error"]["message"].is_string() &&
                !body["error"]["message"].get<std::string>().empty())
        << c.name;
    EXPECT_EQ(r.headers.count("request-id") ? r.headers.at("request-id") : "", "bad-messages-1")
        << c.name;
  }
  // Without anthropic-version, or with one that is not a date.
  for (const std::string& v : {std::string(""), std::string("latest"), std::string("2023-13-01")}) {
    std::vector<std::pair<std::string, std::string>> headers;
    if (!v.empty()) headers.emplace_back("anthropic-version", v);
    const Reply r = Send(port(), "POST", "/v1/messages", Messages(""), headers);
    ASSERT_EQ(r.status, 400) << v << ": " << r.body;
    EXPECT_NE(r.body.find("anthropic-version"), std::string::npos) << r.body;
  }

  const std::vector<Case> responses = {
      {"responses: no input", "POST", "/v1/responses", R"({"model":"smol"})", 400, "input"},
      {"responses: input a number", "POST", "/v1/responses", R"({"model":"smol","input":5})", 400,
       "input"},
      {"responses: an input_image part", "POST", "/v1/responses",
       R"({"model":"smol","input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x/y.png"}]}]})",
       400, ""},
      {"responses: an unknown item type", "POST", "/v1/responses",
       R"({"model":"smol","input":[{"type":"hologram"}]})", 400, ""},
      {"responses: a function_call_output without its call_id", "POST", "/v1/responses",
       R"({"model":"smol","input":[{"type":"function_call_output","output":"r"}]})", 400, ""},
      {"responses: max_output_tokens zero", "POST", "/v1/responses",
       Responses(R"(,"max_output_tokens":0)"), 400, "max_output_tokens"},
      {"responses: temperature 3", "POST", "/v1/responses", Responses(R"(,"temperature":3)"), 400,
       "temperature"},
      {"responses: a web_search tool", "POST", "/v1/responses",
       Responses(R"(,"tools":[{"type":"web_search"}])"), 400, ""},
      {"responses: a json_schema with uniqueItems", "POST", "/v1/responses",
       Responses(
           R"(,"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"array","uniqueItems":true}}})"),
       400, "text.format.schema"},
      {"responses: background", "POST", "/v1/responses", Responses(R"(,"background":true)"), 400,
       "background"},
      {"responses: an unknown field", "POST", "/v1/responses", Responses(R"(,"temprature":1)"), 400,
       ""},
      {"responses: an unknown previous_response_id", "POST", "/v1/responses",
       Responses(R"(,"previous_response_id":"resp_nope")"), 404, "previous_response_id"},
      {"responses: 17 metadata keys", "POST", "/v1/responses",
       Responses(absl::StrCat(R"(,"metadata":)", many_metadata)), 400, "metadata"},
      {"responses: store a string", "POST", "/v1/responses", Responses(R"(,"store":"yes")"), 400,
       "store"},
      {"responses: instructions a number", "POST", "/v1/responses",
       Responses(R"(,"instructions":4)"), 400, "instructions"},
      {"responses: an unknown model", "POST", "/v1/responses", R"({"model":"gpt-5","input":"hi"})",
       404, "model"},
      {"responses: GET an unknown id", "GET", "/v1/responses/resp_nope", "", 404, ""},
      {"responses: DELETE an unknown id", "DELETE", "/v1/responses/resp_nope", "", 404, ""},
      {"responses: PUT", "PUT", "/v1/responses/resp_nope", "{}", 405, ""},
      {"responses: GET the collection", "GET", "/v1/responses", "", 405, ""},
  };
  for (const Case& c : responses) {
    const Reply r = Send(port(), c.method, c.path, c.body, {{"x-request-id", "bad-responses-1"}});
    ASSERT_EQ(r.status, c.status) << c.name << ": " << r.body;
    nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body["error"].is_object()) << c.name << ": " << r.body;
    EXPECT_TRUE(body["error"]["message"].is_string()) << c.name;
    EXPECT_EQ(body["error"]["trace_id"], "bad-responses-1") << c.name;
    if (!c.param.empty()) {
      EXPECT_EQ(body["error"]["param"], c.param) << c.name << ": " << r.body;
    }
  }
  EXPECT_GE(messages.size() + responses.size(), 40u);
  // None of them reached the worker.
  EXPECT_EQ(
      MetricValue(worker_->admin_port(), "ferry_worker_requests_total{outcome=\"completed\"}"),
      completed_before);
  ExpectWorks();
}

// A router with a key file: every way of not presenting a valid key is a 401 with an OpenAI
// error body that never repeats what was sent; the right key in either header passes.
TEST_F(RouterBadInputTest, RequestsWithoutAValidKeyAre401) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string keys = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/bad_input_keys.json");
  {
    std::ofstream f(keys);
    f << R"({"keys": [{"key": "sk-good-0123456789abcdef", "tenant": "acme"}]})";
  }
  ServiceProcess router(g_router,
                        {absl::StrCat("--model=", std::getenv("FERRY_MODEL_GGUF")),
                         "--served_model_name=smol", absl::StrCat("--api_keys_file=", keys),
                         absl::StrCat("--workers=127.0.0.1:", worker_->grpc_port())});
  ASSERT_TRUE(router.ready()) << router.LogTail();
  ASSERT_TRUE(SeesAWorker(router)) << router.LogTail();
  const std::string chat = Chat(R"(,"max_tokens":2)");
  struct AuthCase {
    std::string name;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string code;
  };
  const std::vector<AuthCase> cases = {
      {"no key", {}, "missing_api_key"},
      {"empty bearer", {{"Authorization", "Bearer "}}, "invalid_api_key"},
      {"basic auth", {{"Authorization", "Basic c2stZ29vZDpwdw=="}}, "invalid_api_key"},
      {"bearer without a space",
       {{"Authorization", "Bearersk-good-0123456789abcdef"}},
       "invalid_api_key"},
      {"wrong key", {{"Authorization", "Bearer sk-evil-0123456789abcdef"}}, "invalid_api_key"},
      {"a prefix of the key",
       {{"Authorization", "Bearer sk-good-0123456789abcde"}},
       "invalid_api_key"},
      {"wrong key in x-api-key", {{"x-api-key", "sk-evil-0123456789abcdef"}}, "invalid_api_key"},
      {"key in the wrong header", {{"api-key", "sk-good-0123456789abcdef"}}, "missing_api_key"},
      {"key as a cookie", {{"Cookie", "key=sk-good-0123456789abcdef"}}, "missing_api_key"},
  };
  for (const AuthCase& c : cases) {
    for (const std::string& path :
         {std::string("/v1/chat/completions"), std::string("/v1/models")}) {
      std::vector<std::pair<std::string, std::string>> headers = c.headers;
      headers.emplace_back("x-request-id", "auth-1");
      const Reply r = Send(router.grpc_port(), path == "/v1/models" ? "GET" : "POST", path,
                           path == "/v1/models" ? "" : chat, headers);
      ASSERT_EQ(r.status, 401) << c.name << " " << path << ": " << r.body;
      nlohmann::json body = nlohmann::json::parse(r.body, nullptr, false);
      ASSERT_TRUE(body.is_object() && body.contains("error")) << c.name;
      EXPECT_EQ(body["error"]["code"], c.code) << c.name;
      EXPECT_EQ(body["error"]["type"], "authentication_error") << c.name;
      EXPECT_EQ(body["error"]["trace_id"], "auth-1") << c.name;
      EXPECT_EQ(r.body.find("sk-"), std::string::npos) << c.name << ": " << r.body;
    }
  }
  for (const auto& header : std::vector<std::pair<std::string, std::string>>{
           {"Authorization", "Bearer sk-good-0123456789abcdef"},
           {"authorization", "bearer sk-good-0123456789abcdef"},
           {"x-api-key", "sk-good-0123456789abcdef"}}) {
    const Reply r = Send(router.grpc_port(), "POST", "/v1/chat/completions", chat, {header});
    EXPECT_EQ(r.status, 200) << header.first << ": " << r.body;
  }
  EXPECT_EQ(router.LogTail(100000).find("sk-evil"), std::string::npos) << "a key was logged";
}

TEST_F(RouterBadInputTest, OversizedHeadersAndBodiesAreRefusedAtTheDoor) {
  const Reply big_body =
      Send(port(), "POST", "/v1/chat/completions",
           Chat(absl::StrCat(R"(,"user":")", std::string(200 << 10, 'u'), "\"")));
  EXPECT_EQ(big_body.status, 413);
  const Reply big_header = Send(port(), "POST", "/v1/chat/completions", Chat(""),
                                {{"x-padding", std::string(8 << 10, 'p')}});
  EXPECT_EQ(big_header.status, 431);
  const std::string garbage = SendRaw(port(), "NOT HTTP AT ALL\r\n\r\n");
  EXPECT_NE(garbage.find(" 400 "), std::string::npos) << garbage;
  ExpectWorks();
}

TEST_F(RouterBadInputTest, ASlowClientIsCutOffAndAnIdleOneClosed) {
  // Half a request, then nothing: closed within the read timeout (1 s), not held.
  const std::string slow =
      SendRaw(port(), "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n", absl::Seconds(20));
  EXPECT_EQ(slow, "");  // closed without an answer
  // A keep-alive connection that stays idle is closed after the idle timeout (2 s).
  const std::string idle = SendRaw(port(), "", absl::Seconds(20));
  EXPECT_EQ(idle, "");
  ExpectWorks();
}

TEST_F(RouterBadInputTest, AFloodOfConnectionsIsCappedAndTheServerRecovers) {
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> held;
  int refused = 0;
  for (int i = 0; i < 30; ++i) {
    auto s = std::make_unique<tcp::socket>(io);
    s->connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port())});
    held.push_back(std::move(s));
  }
  // Those past the cap (16) are answered 503 and closed; those within it wait for a request and
  // never answer. All are watched at once (poll(2)) until as many were refused as must have been.
  std::vector<bool> answered(held.size(), false);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (refused < 30 - 16) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < held.size(); ++i) {
      if (answered[i]) continue;
      fds.push_back({held[i]->native_handle(), POLLIN, 0});
      which.push_back(i);
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (fds.empty() || left <= 0) break;
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      tcp::socket& s = *held[which[k]];
      s.non_blocking(true);
      char buf[512];
      beast::error_code ec;
      const size_t n = s.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block) continue;
      answered[which[k]] = true;  // its first answer (or its close), as one read sees it
      if (!ec && std::string(buf, n).find(" 503 ") != std::string::npos) ++refused;
    }
  }
  EXPECT_GE(refused, 30 - 16);
  held.clear();
  // Once they are gone, a request is served again. The server learns of each close as it reads
  // the client's end (the refused ones linger until then), and each try's own connection counts
  // until it has: the request itself is retried, not a probe before it (a probe admitted at 15
  // connections left the request after it at 16).
  Reply r;
  for (int i = 0; i < 100; ++i) {
    r = Send(port(), "POST", "/v1/chat/completions",
             R"({"model":"smol","messages":[{"role":"user","content":"hi"}],"max_tokens":3})");
    if (r.status != 503) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(nlohmann::json::parse(r.body)["usage"]["completion_tokens"], 3);
}

TEST_F(RouterBadInputTest, AClientThatNeverReadsItsStreamIsCutOffAndItsRequestAborted) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.open(tcp::v4());
  socket.set_option(asio::socket_base::receive_buffer_size(4096));
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port())});
  const std::string body =
      R"({"model":"smol","messages":[{"role":"user","content":"go"}],"max_tokens":8000,"n":16,"stream":true,"ignore_eos":true})";
  const std::string request = absl::StrCat(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: ",
      body.size(), "\r\n\r\n", body);
  asio::write(socket, asio::buffer(request));
  // Read nothing. The router stops writing, cuts the stream off and cancels the request; the
  // worker aborts it at its next step.
  const std::string cancelled = "ferry_worker_requests_total{outcome=\"cancelled\"}";
  double n = 0;
  for (int i = 0; i < 600 && n < 1; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    n = MetricValue(worker_->admin_port(), cancelled);
  }
  EXPECT_EQ(n, 1);
  ExpectWorks();
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s FERRY_ROUTER FERRY_WORKER\n", argv[0]);
    return 2;
  }
  ferry::g_router = argv[1];
  ferry::g_worker = argv[2];
  return RUN_ALL_TESTS();
}
