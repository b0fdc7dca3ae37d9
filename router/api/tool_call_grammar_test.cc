#include "router/api/tool_call_grammar.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/grammar/gbnf_parser.h"
#include "engine/grammar/grammar_matcher.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/api/tool_call_parser.h"

namespace ferry {
namespace {

using Mode = ApiToolChoice::Mode;

// get_weather is strict; get_time is not (its schema binds in required and named modes only);
// lookup_é has a non-ASCII name and no parameters (any object: {"type": "object"}).
std::vector<ApiTool> Tools() {
  std::vector<ApiTool> tools(3);
  tools[0].name = "get_weather";
  tools[0].strict = true;
  tools[0].parameters = nlohmann::ordered_json::parse(R"({
      "type": "object",
      "properties": {"city": {"type": "string"},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
      "required": ["city"], "additionalProperties": false})");
  tools[1].name = "get_time";
  tools[1].parameters = nlohmann::ordered_json::parse(
      R"({"properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]})");
  tools[2].name = "lookup_é";
  return tools;
}

ApiToolChoice Choice(Mode mode, std::string function = "") {
  ApiToolChoice c;
  c.mode = mode;
  c.function = std::move(function);
  return c;
}

struct Call {
  std::string name;
  std::string arguments;  // as written
};

// Each format's text for calls, as its template renders them and the model writes them (compact
// JSON inside, the format's own framing around).
std::string Write(ToolCallFormat format, const std::vector<Call>& calls, bool v31 = false) {
  std::string out;
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& c = calls[i];
    const std::string name = nlohmann::json(c.name).dump();
    switch (format) {
      case ToolCallFormat::kHermes:
        out += (i > 0 ? "\n" : "") + std::string("<tool_call>\n{\"name\":") + name +
               ",\"arguments\":" + c.arguments + "}\n</tool_call>";
        break;
      case ToolCallFormat::kLlama3Json:
        out += (i > 0 ? "; " : "") + std::string("{\"name\":") + name +
               ",\"parameters\":" + c.arguments + "}";
        break;
      case ToolCallFormat::kMistral:
        out += (i > 0 ? ", " : "[TOOL_CALLS] [") + std::string("{\"name\":") + name +
               ",\"arguments\":" + c.arguments + "}";
        if (i + 1 == calls.size()) out += "]";
        break;
      case ToolCallFormat::kDeepSeek:
        if (i == 0) out += "<｜tool▁calls▁begin｜>";
        if (v31) {
          out += "<｜tool▁call▁begin｜>" + c.name + "<｜tool▁sep｜>" + c.arguments +
                 "<｜tool▁call▁end｜>";
        } else {
          out += (i > 0 ? "\n" : "") + std::string("<｜tool▁call▁begin｜>function<｜tool▁sep｜>") +
                 c.name + "\n```json\n" + c.arguments + "\n```<｜tool▁call▁end｜>";
        }
        if (i + 1 == calls.size()) out += "<｜tool▁calls▁end｜>";
        break;
    }
  }
  return out;
}

constexpr ToolCallFormat kFormats[] = {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                                       ToolCallFormat::kMistral, ToolCallFormat::kDeepSeek};

std::string Grammar(ToolCallFormat format, Mode mode, bool parallel = true,
                    std::string function = "") {
  ToolCallGrammarOptions options;
  options.format = format;
  options.parallel = parallel;
  absl::StatusOr<std::string> g = ToolCallGrammar(Tools(), Choice(mode, function), options);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : "";
}

// With FERRY_TOOL_CALL_CASES set, every (grammar, text, verdict) checked is appended there as a
// JSON line, for tool_call_grammar_reference.py to replay through llguidance.
void Record(const std::string& gbnf, const std::string& text, bool accepted) {
  const char* path = std::getenv("FERRY_TOOL_CALL_CASES");
  if (path == nullptr) return;
  std::ofstream out(path, std::ios::app);
  out << nlohmann::json({{"gbnf", gbnf}, {"text", text}, {"accepted", accepted}}).dump() << "\n";
}

bool MatcherAccepts(const std::string& gbnf, const std::string& text);

// Whether the grammar accepts `text` as a whole sentence, byte by byte.
bool Accepts(const std::string& gbnf, const std::string& text) {
  const bool accepted = MatcherAccepts(gbnf, text);
  Record(gbnf, text, accepted);
  return accepted;
}

bool MatcherAccepts(const std::string& gbnf, const std::string& text) {
  absl::StatusOr<grammar::Grammar> g = grammar::ParseGbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << gbnf;
  if (!g.ok()) return false;
  absl::StatusOr<grammar::GrammarMatcher> m =
      grammar::GrammarMatcher::Create(std::make_shared<const grammar::Grammar>(*std::move(g)));
  EXPECT_TRUE(m.ok());
  if (!m.ok()) return false;
  for (char c : text) {
    if (m->Advance(static_cast<uint8_t>(c)) != grammar::GrammarMatcher::Step::kOk) return false;
  }
  return m->Accepting();
}

// The format's parser (knowing the tools' names) on `text`: the calls and content it reads.
struct Parsed {
  std::string content;
  std::vector<ParsedToolCall> calls;
};
Parsed Parse(ToolCallFormat format, const std::string& text, bool parallel) {
  ToolCallParserOptions options;
  for (const ApiTool& t : Tools()) options.functions.push_back(t.name);
  options.first_call_only = !parallel;
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(format, options);
  ParsedText out;
  parser->Feed(text, &out);
  parser->Finish(&out);
  return {out.content, parser->calls()};
}

// `text` is accepted, and the parser reads exactly `calls` out of it (and `content`).
void ExpectCalls(ToolCallFormat format, const std::string& gbnf, const std::string& text,
                 const std::vector<Call>& calls, bool parallel = true,
                 const std::string& content = "") {
  SCOPED_TRACE(std::string(ToolCallFormatName(format)) + ": " + text);
  EXPECT_TRUE(Accepts(gbnf, text));
  const Parsed p = Parse(format, text, parallel);
  EXPECT_EQ(p.content, content);
  ASSERT_EQ(p.calls.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(p.calls[i].name, calls[i].name);
    EXPECT_EQ(p.calls[i].arguments, calls[i].arguments);
    EXPECT_TRUE(p.calls[i].complete);
    EXPECT_TRUE(p.calls[i].arguments_valid);
  }
}

void ExpectRefused(ToolCallFormat format, const std::string& gbnf, const std::string& text) {
  EXPECT_FALSE(Accepts(gbnf, text)) << ToolCallFormatName(format) << ": " << text;
}

const Call kWeather = {"get_weather", R"({"city":"Paris","days":3})"};
const Call kWeatherCityOnly = {"get_weather", R"({"city":"Zürich \"Nord\""})"};
const Call kTime = {"get_time", R"({"tz":"CET"})"};
const Call kLookup = {"lookup_é", "{}"};

TEST(ToolCallGrammarTest, RequiredAcceptsCallsOfAnyToolAndNothingElse) {
  for (ToolCallFormat f : kFormats) {
    const std::string g = Grammar(f, Mode::kRequired);
    ExpectCalls(f, g, Write(f, {kWeather}), {kWeather});
    ExpectCalls(f, g, Write(f, {kWeatherCityOnly, kTime, kLookup}),
                {kWeatherCityOnly, kTime, kLookup});
    // Text before the call; an unknown name; arguments against the schema (days out of range,
    // city missing, a property not in it, a non-strict tool's schema too, no object at all).
    ExpectRefused(f, g, "Sure. " + Write(f, {kWeather}));
    ExpectRefused(f, g, "");
    ExpectRefused(f, g, Write(f, {{"get_wether", R"({"city":"Paris"})"}}));
    ExpectRefused(f, g, Write(f, {{"get_weather", R"({"city":"Paris","days":9})"}}));
    ExpectRefused(f, g, Write(f, {{"get_weather", R"({"days":3})"}}));
    ExpectRefused(f, g, Write(f, {{"get_weather", R"({"city":"Paris","x":1})"}}));
    ExpectRefused(f, g, Write(f, {{"get_time", R"({"tz":"PST"})"}}));
    ExpectRefused(f, g, Write(f, {{"get_weather", R"("{\"city\":\"Paris\"}")"}}));
    // Text after the calls; non-compact JSON.
    ExpectRefused(f, g, Write(f, {kWeather}) + " Done.");
    ExpectRefused(f, g, Write(f, {{"get_weather", R"({"city": "Paris"})"}}));
  }
  // The writer's own literals, once per format, so the test does not only agree with itself.
  ExpectCalls(ToolCallFormat::kHermes, Grammar(ToolCallFormat::kHermes, Mode::kRequired),
              "<tool_call>\n{\"name\":\"get_time\",\"arguments\":{\"tz\":\"UTC\"}}\n</tool_call>\n"
              "<tool_call>\n{\"name\":\"lookup_é\",\"arguments\":{}}\n</tool_call>",
              {{"get_time", R"({"tz":"UTC"})"}, kLookup});
  ExpectCalls(ToolCallFormat::kLlama3Json, Grammar(ToolCallFormat::kLlama3Json, Mode::kRequired),
              "<|python_tag|>{\"name\":\"get_time\",\"parameters\":{\"tz\":\"UTC\"}}",
              {{"get_time", R"({"tz":"UTC"})"}});
  ExpectCalls(ToolCallFormat::kMistral, Grammar(ToolCallFormat::kMistral, Mode::kRequired),
              "[TOOL_CALLS] [{\"name\":\"get_time\",\"arguments\":{\"tz\":\"UTC\"}}, "
              "{\"name\":\"lookup_é\",\"arguments\":{}}]",
              {{"get_time", R"({"tz":"UTC"})"}, kLookup});
  ExpectCalls(ToolCallFormat::kDeepSeek, Grammar(ToolCallFormat::kDeepSeek, Mode::kRequired),
              "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n"
              "{\"tz\":\"UTC\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
              {{"get_time", R"({"tz":"UTC"})"}});
  // Markers and fences inside argument strings are text.
  for (ToolCallFormat f : kFormats) {
    const Call tricky = {"get_weather",
                         R"({"city":"```</tool_call>[TOOL_CALLS]<｜tool▁call▁end｜>; {\"x\"}"})"};
    ExpectCalls(f, Grammar(f, Mode::kRequired), Write(f, {tricky, kTime}), {tricky, kTime});
    ExpectCalls(f, Grammar(f, Mode::kAuto), Write(f, {tricky}), {tricky});
  }
  // DeepSeek V3.1's call head.
  const std::string ds = Grammar(ToolCallFormat::kDeepSeek, Mode::kRequired);
  ExpectCalls(ToolCallFormat::kDeepSeek, ds, Write(ToolCallFormat::kDeepSeek, {kWeather}, true),
              {kWeather});
  ExpectCalls(ToolCallFormat::kDeepSeek, ds,
              Write(ToolCallFormat::kDeepSeek, {kWeather, kTime}, true), {kWeather, kTime});
}

TEST(ToolCallGrammarTest, OneCallWhenNotParallel) {
  for (ToolCallFormat f : kFormats) {
    const std::string g = Grammar(f, Mode::kRequired, /*parallel=*/false);
    ExpectCalls(f, g, Write(f, {kTime}), {kTime}, /*parallel=*/false);
    ExpectRefused(f, g, Write(f, {kTime, kWeather}));
  }
}

TEST(ToolCallGrammarTest, NamedFunctionIsExactlyOneCallOfIt) {
  for (ToolCallFormat f : kFormats) {
    const std::string g = Grammar(f, Mode::kFunction, /*parallel=*/true, "get_time");
    ExpectCalls(f, g, Write(f, {kTime}), {kTime});
    ExpectRefused(f, g, Write(f, {kWeather}));
    ExpectRefused(f, g, Write(f, {kTime, kTime}));
    ExpectRefused(f, g, Write(f, {{"get_time", R"({"tz":"PST"})"}}));
  }
}

TEST(ToolCallGrammarTest, AutoAllowsTextThenCallsAndBindsOnlyStrictTools) {
  const std::string free_text = "Let me check the weather < [TOOL_CALLS and {braces}.\n";
  const Call any_time = {"get_time", R"({"anything":[1,{"tz":null}],"x":"é"})"};
  for (ToolCallFormat f : kFormats) {
    const std::string g = Grammar(f, Mode::kAuto);
    ExpectCalls(f, g, free_text, {}, true, free_text);
    ExpectCalls(f, g, "", {});
    ExpectCalls(f, g, Write(f, {kWeather, any_time}), {kWeather, any_time});
    ExpectRefused(f, g, Write(f, {{"get_weather", R"({"city":"Paris","days":0})"}}));
    ExpectRefused(f, g, Write(f, {{"get_weather", R"({"city":"Paris"})"}}) + "\nDone.");
    ExpectRefused(f, g, Write(f, {{"unknown", "{}"}}));
    ExpectRefused(f, g, Write(f, {{"get_time", "[]"}}));  // not an object
    if (f == ToolCallFormat::kLlama3Json) {
      // Calls only at the start: a reply that begins with text is content throughout, a
      // call's text in it included (the parser reads no call there).
      const std::string later = free_text + Write(f, {{"get_weather", R"({"days":0})"}});
      ExpectCalls(f, g, later, {}, true, later);
      ExpectRefused(f, g, "<|python_tag|>print(1)");
      ExpectRefused(f, g, "  {\"a\":1}");
      ExpectCalls(f, g, "<|python", {}, true, "<|python");
      ExpectCalls(f, g, " <b>bold</b>", {}, true, " <b>bold</b>");
    } else {
      ExpectCalls(f, g, free_text + Write(f, {kWeather}), {kWeather}, true, free_text);
    }
  }
  // The marker in free text must begin calls.
  const std::string hermes = Grammar(ToolCallFormat::kHermes, Mode::kAuto);
  ExpectRefused(ToolCallFormat::kHermes, hermes, "a <tool_call> b");
  ExpectCalls(ToolCallFormat::kHermes, hermes, "a <tool_call b </tool_call>", {}, true,
              "a <tool_call b </tool_call>");
  const std::string deepseek = Grammar(ToolCallFormat::kDeepSeek, Mode::kAuto);
  ExpectRefused(ToolCallFormat::kDeepSeek, deepseek, "a <｜tool▁call▁begin｜> b");
  ExpectRefused(ToolCallFormat::kDeepSeek, deepseek, "a <｜tool▁calls▁begin｜> b");
  // Not parallel: text and one call.
  ToolCallGrammarOptions options;
  options.parallel = false;
  absl::StatusOr<std::string> one = ToolCallGrammar(Tools(), Choice(Mode::kAuto), options);
  ASSERT_TRUE(one.ok());
  ExpectCalls(ToolCallFormat::kHermes, *one, "Hm. " + Write(ToolCallFormat::kHermes, {kTime}),
              {kTime}, /*parallel=*/false, "Hm. ");
  ExpectRefused(ToolCallFormat::kHermes, *one, Write(ToolCallFormat::kHermes, {kTime, kTime}));
}

TEST(ToolCallGrammarTest, NothingToConstrain) {
  std::vector<ApiTool> loose = Tools();
  loose[0].strict = false;
  ToolCallGrammarOptions options;
  EXPECT_EQ(*ToolCallGrammar(loose, Choice(Mode::kAuto), options), "");
  EXPECT_EQ(*ToolCallGrammar(Tools(), Choice(Mode::kNone), options), "");
}

TEST(ToolCallGrammarTest, BoundedWhitespace) {
  ToolCallGrammarOptions options;
  options.schema.whitespace = grammar::JsonWhitespace::kBounded;
  absl::StatusOr<std::string> g = ToolCallGrammar(Tools(), Choice(Mode::kRequired), options);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string text =
      "<tool_call>\n{ \"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"} }\n"
      "</tool_call>";
  ExpectCalls(ToolCallFormat::kHermes, *g, text, {{"get_weather", R"({"city": "Paris"})"}});
  ExpectRefused(ToolCallFormat::kHermes, *g,
                "<tool_call>\n{     \"name\":\"get_weather\",\"arguments\":{\"city\":\"P\"}}\n"
                "</tool_call>");
}

TEST(ToolCallGrammarTest, Errors) {
  ToolCallGrammarOptions options;
  std::vector<ApiTool> tools = Tools();
  tools[1].parameters = nlohmann::ordered_json::parse(R"({"properties": {"x": {"not": {}}}})");
  // A non-strict tool's schema beyond the compiler: best effort, its arguments any object.
  absl::StatusOr<std::string> g = ToolCallGrammar(tools, Choice(Mode::kRequired), options);
  ASSERT_TRUE(g.ok()) << g.status();
  ExpectCalls(ToolCallFormat::kHermes, *g,
              "<tool_call>\n{\"name\":\"" + tools[1].name +
                  "\",\"arguments\":{\"x\":[1],\"y\":null}}\n</tool_call>",
              {{tools[1].name, R"({"x":[1],"y":null})"}});
  EXPECT_TRUE(ToolCallGrammar(tools, Choice(Mode::kAuto), options).ok());  // not strict
  EXPECT_TRUE(ToolCallGrammar(tools, Choice(Mode::kFunction, "get_weather"), options).ok());
  // A strict tool's schema must be enforced: refused, naming the tool.
  tools[1].strict = true;
  for (Mode mode : {Mode::kAuto, Mode::kRequired}) {
    g = ToolCallGrammar(tools, Choice(mode), options);
    ASSERT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("tools[1].function.parameters: "), std::string::npos)
        << g.status();
    EXPECT_NE(g.status().message().find("not"), std::string::npos) << g.status();
  }

  tools = Tools();
  tools[0].strict = true;
  tools[0].parameters = nlohmann::ordered_json::parse(R"({"type": "array"})");
  g = ToolCallGrammar(tools, Choice(Mode::kRequired), options);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("tools[0].function.parameters"), std::string::npos);

  g = ToolCallGrammar(Tools(), Choice(Mode::kFunction, "nope"), options);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("'nope'"), std::string::npos);
  g = ToolCallGrammar({}, Choice(Mode::kRequired), options);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);

  // The whole text is bounded like one schema's.
  ToolCallGrammarOptions small;
  small.schema.max_grammar_bytes = 1500;
  g = ToolCallGrammar(Tools(), Choice(Mode::kRequired), small);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("exceeds the limit of 1500 bytes"), std::string::npos)
      << g.status();

  // A name DeepSeek's syntax cannot carry.
  tools = Tools();
  tools[2].name = "two\nlines";
  options.format = ToolCallFormat::kDeepSeek;
  g = ToolCallGrammar(tools, Choice(Mode::kRequired), options);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("tools[2].function.name"), std::string::npos);
  options.format = ToolCallFormat::kHermes;
  EXPECT_TRUE(ToolCallGrammar(tools, Choice(Mode::kRequired), options).ok());
}

}  // namespace
}  // namespace ferry
