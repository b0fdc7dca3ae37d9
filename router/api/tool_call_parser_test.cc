#include "router/api/tool_call_parser.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

// Whether `s` is whole UTF-8 (no character cut at either end).
bool WholeUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// What a client rebuilds from the stream, as the OpenAI SDK does: content joined, each call's id
// and name from its first delta, its arguments joined.
struct Rebuilt {
  std::string content;
  std::vector<ParsedToolCall> calls;
  std::vector<ParsedToolCall> parser_calls;  // the parser's own view at the end
  int pieces_emitted = 0;
  bool pieces_whole_utf8 = true;
  bool id_or_name_repeated = false;
};

void Absorb(const ParsedText& t, Rebuilt* r) {
  if (!t.content.empty()) {
    ++r->pieces_emitted;
    r->pieces_whole_utf8 = r->pieces_whole_utf8 && WholeUtf8(t.content);
    r->content += t.content;
  }
  for (const ToolCallDelta& d : t.tool_calls) {
    ++r->pieces_emitted;
    r->pieces_whole_utf8 = r->pieces_whole_utf8 && WholeUtf8(d.arguments);
    if (d.index == static_cast<int>(r->calls.size())) {
      ASSERT_FALSE(d.id.empty());
      ASSERT_FALSE(d.name.empty());
      r->calls.push_back({d.id, d.name, "", false, false});
    } else {
      ASSERT_LT(d.index, static_cast<int>(r->calls.size()));
      if (!d.id.empty() || !d.name.empty()) r->id_or_name_repeated = true;
    }
    r->calls[d.index].arguments += d.arguments;
  }
}

Rebuilt Parse(ToolCallFormat format, const std::vector<std::string>& pieces,
              std::vector<std::string> functions = {}, bool first_call_only = false) {
  ToolCallParserOptions options;
  options.functions = std::move(functions);
  options.first_call_only = first_call_only;
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(format, std::move(options));
  Rebuilt r;
  for (const std::string& piece : pieces) {
    ParsedText t;
    parser->Feed(piece, &t);
    Absorb(t, &r);
  }
  ParsedText t;
  parser->Finish(&t);
  Absorb(t, &r);
  r.parser_calls = parser->calls();
  return r;
}

void ExpectSame(const Rebuilt& a, const Rebuilt& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << where;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
    EXPECT_EQ(b.calls[i].arguments, b.parser_calls[i].arguments) << where;
    EXPECT_EQ(a.parser_calls[i].complete, b.parser_calls[i].complete) << where;
    EXPECT_EQ(a.parser_calls[i].arguments_valid, b.parser_calls[i].arguments_valid) << where;
  }
  EXPECT_TRUE(b.pieces_whole_utf8) << where;
  EXPECT_FALSE(b.id_or_name_repeated) << where;
}

// The same text whole, split at every byte, and in random pieces gives the same result.
Rebuilt ExpectSplitInvariant(const std::string& text, std::vector<std::string> functions = {},
                             ToolCallFormat format = ToolCallFormat::kHermes,
                             bool first_call_only = false) {
  auto Parse = [&](const std::vector<std::string>& pieces, const std::vector<std::string>& fns) {
    return ::ferry::Parse(format, pieces, fns, first_call_only);
  };
  const Rebuilt whole = Parse({text}, functions);
  EXPECT_TRUE(whole.pieces_whole_utf8);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ExpectSame(whole, Parse({text.substr(0, cut), text.substr(cut)}, functions),
               "cut at byte " + std::to_string(cut));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.push_back(std::string(1, c));
  ExpectSame(whole, Parse(bytes, functions), "byte by byte");
  std::mt19937 rng(42);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t n = std::min<size_t>(text.size() - at, 1 + rng() % 7);
      pieces.push_back(text.substr(at, n));
      at += n;
    }
    ExpectSame(whole, Parse(pieces, functions), "random pieces, round " + std::to_string(round));
  }
  return whole;
}

nlohmann::json Json(const std::string& s) { return nlohmann::json::parse(s); }

TEST(HermesToolCallParserTest, OneCallBetweenContent) {
  const Rebuilt r = ExpectSplitInvariant(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 3}}\n</tool_call>\nDone.");
  EXPECT_EQ(r.content, "Let me look.\n\nDone.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].id, "call_0");
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Json(r.calls[0].arguments), Json(R"({"city": "Paris", "days": 3})"));
  EXPECT_TRUE(r.parser_calls[0].complete);
  EXPECT_TRUE(r.parser_calls[0].arguments_valid);
}

TEST(HermesToolCallParserTest, ParallelCallsAndNestedArguments) {
  const Rebuilt r = ExpectSplitInvariant(
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"q\": {\"deep\": [1, {\"x\": \"}]\"}]}, "
      "\"s\": \"</tool_call> inside \\\"quotes\\\" \\\\\"}}</tool_call><tool_call>{\"arguments\": "
      "{}, \"name\": \"b\"}</tool_call>");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(Json(r.calls[0].arguments),
            Json(R"({"q": {"deep": [1, {"x": "}]"}]}, "s": "</tool_call> inside \"quotes\" \\"})"));
  EXPECT_EQ(r.calls[1].id, "call_1");
  EXPECT_EQ(r.calls[1].name, "b");  // arguments written before the name still follow it
  EXPECT_EQ(Json(r.calls[1].arguments), nlohmann::json::object());
}

TEST(HermesToolCallParserTest, ArgumentsStreamAsTheyArrive) {
  ToolCallParserOptions options;
  options.call_id = [](int i) { return "id_" + std::to_string(i); };
  std::unique_ptr<ToolCallParser> parser = NewToolCallParser(ToolCallFormat::kHermes, options);
  ParsedText t;
  parser->Feed("<tool_call>{\"name\": \"f\", \"arguments\": {\"text\": \"hel", &t);
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_EQ(t.tool_calls[0].name, "f");
  EXPECT_EQ(t.tool_calls[0].arguments, "{\"text\": \"hel");
  t = {};
  parser->Feed("lo\"}}</tool_", &t);
  ASSERT_EQ(t.tool_calls.size(), 1u);
  EXPECT_TRUE(t.tool_calls[0].name.empty());
  EXPECT_EQ(t.tool_calls[0].arguments, "lo\"}");
  EXPECT_FALSE(parser->calls()[0].complete);
  t = {};
  parser->Feed("call>", &t);
  EXPECT_TRUE(t.empty());
  EXPECT_TRUE(parser->calls()[0].complete);
}

TEST(HermesToolCallParserTest, Utf8IsNeverCut) {
  ExpectSplitInvariant(
      "Température 😀 é<tool_call>{\"name\": \"say\", \"arguments\": {\"t\": \"日本語 😀\"}}"
      "</tool_call>ü");
}

TEST(HermesToolCallParserTest, WhatIsNotACallIsContentByteForByte) {
  const std::vector<std::string> texts = {
      "a < b and <tool_ca but not a marker <tool",
      "<tool_call>not json at all</tool_call> after",
      "<tool_call>{\"arguments\": {\"x\": 1}}</tool_call>",  // no name
      "<tool_call>{\"name\": 42, \"arguments\": {}}</tool_call>",
      "<tool_call>[1, 2]</tool_call>",
      "<tool_call>{\"name\": \"unknown_fn\", \"arguments\": {}}</tool_call> tail",
  };
  for (const std::string& text : texts) {
    const Rebuilt r = ExpectSplitInvariant(text, {"get_weather"});
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
}

TEST(HermesToolCallParserTest, ATruncatedCallStaysIncomplete) {
  // Cut by max_tokens inside the arguments: the call began, its arguments are not JSON.
  const Rebuilt r =
      ExpectSplitInvariant("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": [1, 2");
  EXPECT_FALSE(r.parser_calls[0].complete);
  EXPECT_FALSE(r.parser_calls[0].arguments_valid);
  // Cut before the name ended: nothing was a call.
  const Rebuilt early = ExpectSplitInvariant("ok <tool_call>{\"name\": \"f");
  EXPECT_EQ(early.content, "ok <tool_call>{\"name\": \"f");
  EXPECT_TRUE(early.calls.empty());
}

TEST(HermesToolCallParserTest, BrokenJsonAfterTheNameEndsTheCallAtItsMarker) {
  const Rebuilt r = ExpectSplitInvariant(
      "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}, oops}</tool_call>after");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_TRUE(r.parser_calls[0].complete);
  EXPECT_EQ(r.content, "after");
}

TEST(HermesToolCallParserTest, StringifiedAndMissingArguments) {
  const Rebuilt r = ExpectSplitInvariant(
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"
      "<tool_call>{\"name\": \"g\"}</tool_call><tool_call>{\"name\": \"h\", \"parameters\": "
      "{\"b\": true}}</tool_call>");
  ASSERT_EQ(r.calls.size(), 3u);
  EXPECT_EQ(Json(r.calls[0].arguments), Json(R"({"a": 1})"));
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_EQ(Json(r.calls[2].arguments), Json(R"({"b": true})"));
  for (const ParsedToolCall& c : r.parser_calls) EXPECT_TRUE(c.arguments_valid) << c.name;
}

TEST(HermesToolCallParserTest, ScalarValuesAndWhitespaceBeforeTheMarker) {
  const Rebuilt r = ExpectSplitInvariant(
      "<tool_call>  {\"id\": 7, \"name\": \"f\" , \"ok\": true, \"arguments\": {\"n\": -1.5e3}"
      " }  \n </tool_call>x");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(Json(r.calls[0].arguments), Json(R"({"n": -1.5e3})"));
  EXPECT_EQ(r.content, "x");
}

// Random sequences of the pieces calls are made of (markers, JSON punctuation, names, escapes,
// multi-byte text): no crash, and the same result however the text is split.
TEST(HermesToolCallParserTest, RandomTextIsSplitInvariant) {
  const std::vector<std::string> atoms = {"<tool_call>", "</tool_call>",
                                          "{",           "}",
                                          "[",           "]",
                                          "\"name\"",    "\"arguments\"",
                                          ":",           ",",
                                          "\"f\"",       "\"",
                                          "\\",          " ",
                                          "\n",          "x",
                                          "1",           "true",
                                          "é",           "<tool",
                                          "</tool_"};
  std::mt19937 rng(7);
  for (int round = 0; round < 150; ++round) {
    std::string text;
    const int n = 4 + static_cast<int>(rng() % 24);
    for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
    SCOPED_TRACE(text);
    const Rebuilt r = ExpectSplitInvariant(
        text, round % 2 == 0 ? std::vector<std::string>{} : std::vector<std::string>{"f"});
    for (const ParsedToolCall& c : r.parser_calls) EXPECT_EQ(c.name, "f");
  }
}

TEST(HermesToolCallParserTest, FirstCallOnlyDropsWhatFollows) {
  const Rebuilt r = ExpectSplitInvariant(
      "a<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>b<tool_call>{\"name\": \"g\", "
      "\"arguments\": {}}</tool_call>",
      {}, ToolCallFormat::kHermes, /*first_call_only=*/true);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "f");
  EXPECT_EQ(r.content, "a");
}

TEST(ToolCallFormatTest, NamesAndDetectionFromTemplates) {
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                           ToolCallFormat::kMistral, ToolCallFormat::kDeepSeek}) {
    EXPECT_EQ(ToolCallFormatFromName(ToolCallFormatName(f)), f);
  }
  EXPECT_FALSE(ToolCallFormatFromName("nope").has_value());
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>\\n' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{{- \"[TOOL_CALLS] [\" }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("'<｜tool▁call▁begin｜>' + tool['type']"),
            ToolCallFormat::kDeepSeek);
  EXPECT_EQ(DetectToolCallFormat("{{- '\"parameters\": ' }} ipython"), ToolCallFormat::kLlama3Json);
  EXPECT_FALSE(DetectToolCallFormat("{{ '<|im_start|>' + message['role'] }}").has_value());
}

TEST(Llama3JsonToolCallParserTest, AReplyThatIsACall) {
  const Rebuilt r = ExpectSplitInvariant(
      "\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Zürich\", \"n\": [1, {\"k\": "
      "\"};\"}]}}",
      {}, ToolCallFormat::kLlama3Json);
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Json(r.calls[0].arguments), Json(R"({"city": "Zürich", "n": [1, {"k": "};"}]})"));
  EXPECT_TRUE(r.parser_calls[0].complete);
  EXPECT_TRUE(r.parser_calls[0].arguments_valid);
}

TEST(Llama3JsonToolCallParserTest, PythonTagAndSeveralCalls) {
  const Rebuilt r = ExpectSplitInvariant(
      "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", "
      "\"arguments\": {}}",
      {}, ToolCallFormat::kLlama3Json);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].id, "call_1");
  EXPECT_EQ(Json(r.calls[0].arguments), Json(R"({"x": 1})"));
  EXPECT_EQ(r.content, "");
}

TEST(Llama3JsonToolCallParserTest, TextIsContentAndSoIsWhatIsNotACall) {
  const std::vector<std::string> texts = {
      "The weather is {\"name\": \"get_weather\"} nice.",  // a call only at the start
      "{\"name\": \"unknown\", \"parameters\": {}}",
      "{not json}",
      "{\"parameters\": {\"a\": 1}}",
      "<|python_tag|>print(1)",
      "{\"name\": \"get_weather\", \"parameters\": {}} and then text",
  };
  for (const std::string& text : texts) {
    const Rebuilt r = ExpectSplitInvariant(text, {"get_weather"}, ToolCallFormat::kLlama3Json);
    if (text.rfind("{\"name\": \"get_weather\"", 0) == 0) {
      ASSERT_EQ(r.calls.size(), 1u) << text;
      EXPECT_EQ(r.content, " and then text");
    } else {
      EXPECT_EQ(r.content, text);
      EXPECT_TRUE(r.calls.empty()) << text;
    }
  }
}

TEST(MistralToolCallParserTest, AListOfCallsAfterContent) {
  const Rebuilt r = ExpectSplitInvariant(
      "Sure. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
      "\"id\": \"abcdefghi\"}, {\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": "
      "\\\"CET\\\"}\""
      "}]",
      {}, ToolCallFormat::kMistral);
  EXPECT_EQ(r.content, "Sure. ");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Json(r.calls[0].arguments), Json(R"({"city": "Paris"})"));
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(Json(r.calls[1].arguments), Json(R"({"tz": "CET"})"));
  for (const ParsedToolCall& c : r.parser_calls) EXPECT_TRUE(c.complete && c.arguments_valid);
}

TEST(MistralToolCallParserTest, ABareObjectAndWhatIsNotACall) {
  const Rebuilt bare = ExpectSplitInvariant("[TOOL_CALLS]{\"name\": \"f\", \"arguments\": {}}", {},
                                            ToolCallFormat::kMistral);
  ASSERT_EQ(bare.calls.size(), 1u);
  EXPECT_EQ(bare.content, "");
  for (const std::string& text :
       {std::string("[TOOL_CALLS] nothing"), std::string("[TOOL_CALLS] [{\"name\": \"zz\"}]"),
        std::string("a [TOOL_CALL b")}) {
    const Rebuilt r = ExpectSplitInvariant(text, {"f"}, ToolCallFormat::kMistral);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
  // Cut by max_tokens inside the second call's arguments.
  const Rebuilt cut = ExpectSplitInvariant(
      "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"f\", \"arguments\": {\"a",
      {}, ToolCallFormat::kMistral);
  ASSERT_EQ(cut.calls.size(), 2u);
  EXPECT_TRUE(cut.parser_calls[0].complete);
  EXPECT_FALSE(cut.parser_calls[1].complete);
  EXPECT_FALSE(cut.parser_calls[1].arguments_valid);
}

TEST(DeepSeekToolCallParserTest, V3CallsWithFencedArguments) {
  const Rebuilt r = ExpectSplitInvariant(
      "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"東京\", \"q\": \"a`b\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>"
      "function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>ok",
      {}, ToolCallFormat::kDeepSeek);
  EXPECT_EQ(r.content, "Let me check.ok");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(Json(r.calls[0].arguments), Json(R"({"city": "東京", "q": "a`b"})"));
  EXPECT_EQ(r.calls[1].name, "get_time");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  for (const ParsedToolCall& c : r.parser_calls) EXPECT_TRUE(c.complete && c.arguments_valid);
}

TEST(DeepSeekToolCallParserTest, V31HeadsUnknownFunctionsAndTruncation) {
  const Rebuilt v31 = ExpectSplitInvariant(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [1]}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>",
      {"f"}, ToolCallFormat::kDeepSeek);
  ASSERT_EQ(v31.calls.size(), 1u);
  EXPECT_EQ(Json(v31.calls[0].arguments), Json(R"({"a": [1]})"));
  const std::string unknown =
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>zz\n```json\n{}\n```<｜tool▁call▁end｜>";
  const Rebuilt u = ExpectSplitInvariant(unknown, {"f"}, ToolCallFormat::kDeepSeek);
  EXPECT_TRUE(u.calls.empty());
  EXPECT_EQ(u.content, unknown);
  const Rebuilt cut = ExpectSplitInvariant(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": ", {},
      ToolCallFormat::kDeepSeek);
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, "{\"a\":");
  EXPECT_FALSE(cut.parser_calls[0].complete);
  EXPECT_FALSE(cut.parser_calls[0].arguments_valid);
}

TEST(DeepSeekToolCallParserTest, FencesAndMarkersInsideJsonArgumentStrings) {
  const std::string code = R"({"code": "```py\nprint('<｜tool▁call▁end｜>')\n```", "n": [1]})";
  const Rebuilt v3 = ExpectSplitInvariant(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n" + code +
          "\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\n{}\n```"
          "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
      {}, ToolCallFormat::kDeepSeek);
  ASSERT_EQ(v3.calls.size(), 2u);
  EXPECT_EQ(v3.calls[0].arguments, code);
  EXPECT_EQ(v3.calls[1].arguments, "{}");
  EXPECT_EQ(v3.content, "");
  const Rebuilt v31 =
      ExpectSplitInvariant("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>" + code +
                               "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                           {}, ToolCallFormat::kDeepSeek);
  ASSERT_EQ(v31.calls.size(), 1u);
  EXPECT_EQ(v31.calls[0].arguments, code);
  EXPECT_TRUE(v31.parser_calls[0].complete && v31.parser_calls[0].arguments_valid);
  EXPECT_EQ(v31.content, "");
}

TEST(ToolCallParserTest, ArgumentsThatAreNotJsonAreKeptAndFlagged) {
  // A scalar where the object should be (JSON formats) and free text (DeepSeek): the call is
  // whole, its arguments are the model's text, arguments_valid says they are not an object.
  const Rebuilt hermes = ExpectSplitInvariant(
      "<tool_call>{\"name\": \"f\", \"arguments\": nope}</tool_call>", {}, ToolCallFormat::kHermes);
  ASSERT_EQ(hermes.calls.size(), 1u);
  EXPECT_EQ(hermes.calls[0].arguments, "nope");
  EXPECT_TRUE(hermes.parser_calls[0].complete);
  EXPECT_FALSE(hermes.parser_calls[0].arguments_valid);
  const Rebuilt deepseek = ExpectSplitInvariant(
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\ncity=Paris\n```<｜tool▁call▁end｜>",
      {}, ToolCallFormat::kDeepSeek);
  ASSERT_EQ(deepseek.calls.size(), 1u);
  EXPECT_EQ(deepseek.calls[0].arguments, "city=Paris");
  EXPECT_TRUE(deepseek.parser_calls[0].complete);
  EXPECT_FALSE(deepseek.parser_calls[0].arguments_valid);
}

// Random sequences of each format's pieces: no crash, split invariant, only known names.
TEST(ToolCallParserTest, RandomTextIsSplitInvariantInEveryFormat) {
  const std::vector<std::string> common = {"{",
                                           "}",
                                           "[",
                                           "]",
                                           "\"name\"",
                                           "\"arguments\"",
                                           "\"parameters\"",
                                           ":",
                                           ",",
                                           ";",
                                           "\"f\"",
                                           "\"",
                                           "\\",
                                           " ",
                                           "\n",
                                           "x",
                                           "1",
                                           "é",
                                           "```",
                                           "```json"};
  const std::vector<std::pair<ToolCallFormat, std::vector<std::string>>> formats = {
      {ToolCallFormat::kLlama3Json, {"<|python_tag|>", "<|python"}},
      {ToolCallFormat::kMistral, {"[TOOL_CALLS]", "[TOOL_"}},
      {ToolCallFormat::kDeepSeek,
       {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>", "function", "<｜tool▁"}},
  };
  std::mt19937 rng(11);
  for (const auto& [format, markers] : formats) {
    std::vector<std::string> atoms = common;
    atoms.insert(atoms.end(), markers.begin(), markers.end());
    for (int round = 0; round < 60; ++round) {
      std::string text;
      const int n = 4 + static_cast<int>(rng() % 20);
      for (int i = 0; i < n; ++i) text += atoms[rng() % atoms.size()];
      SCOPED_TRACE(text);
      const Rebuilt r = ExpectSplitInvariant(
          text, round % 2 == 0 ? std::vector<std::string>{} : std::vector<std::string>{"f"},
          format);
      if (round % 2 == 1) {
        for (const ParsedToolCall& c : r.parser_calls) EXPECT_EQ(c.name, "f");
      }
    }
  }
}

}  // namespace
}  // namespace ferry
