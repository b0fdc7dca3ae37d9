// AppendJsonString and IsValidUtf8 against nlohmann::json (the library every other event is
// written with): random strings of ASCII, control characters, quotes, backslashes, multibyte
// UTF-8 and broken bytes. And OpenAiWriter's text-only stream events (written from a template)
// are the bytes nlohmann writes for the same document.

#include "router/api/json_string.h"

#include <random>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/api/openai_writer.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

std::string Reference(const std::string& text) {
  return Json(text).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// nlohmann's own verdict on UTF-8: a strict dump throws on invalid bytes.
bool ReferenceValid(const std::string& text) {
  try {
    Json(text).dump(-1, ' ', false, Json::error_handler_t::strict);
    return true;
  } catch (const Json::type_error&) {
    return false;
  }
}

std::string RandomText(std::mt19937_64& rng) {
  static const std::vector<std::string> kPieces = {"a",
                                                   "Z",
                                                   " ",
                                                   "\"",
                                                   "\\",
                                                   "/",
                                                   "\n",
                                                   "\r",
                                                   "\t",
                                                   "\b",
                                                   "\f",
                                                   std::string(1, '\0'),
                                                   "\x01",
                                                   "\x1f",
                                                   "\x7f",
                                                   "é",
                                                   "€",
                                                   "😀",
                                                   "中文",
                                                   "\xc3",
                                                   "\xe2\x82",
                                                   "\xf0\x9f\x98",
                                                   "\xff",
                                                   "\xc0\xaf",
                                                   "\xed\xa0\x80",
                                                   "\xf4\x90\x80\x80",
                                                   "{}",
                                                   "<|im_end|>"};
  std::string s;
  const int n = static_cast<int>(rng() % 12);
  for (int i = 0; i < n; ++i) s += kPieces[rng() % kPieces.size()];
  return s;
}

TEST(JsonStringTest, MatchesNlohmannOnRandomText) {
  std::mt19937_64 rng(50);
  int valid = 0, invalid = 0;
  for (int i = 0; i < 20000; ++i) {
    const std::string text = RandomText(rng);
    std::string out = "prefix";
    const bool ok = AppendJsonString(text, &out);
    ASSERT_EQ(ok, ReferenceValid(text)) << i;
    ASSERT_EQ(IsValidUtf8(text), ReferenceValid(text)) << i;
    if (ok) {
      ++valid;
      ASSERT_EQ(out, "prefix" + Reference(text)) << i;
    } else {
      ++invalid;
      ASSERT_EQ(out, "prefix") << i;
    }
  }
  EXPECT_GT(valid, 1000);
  EXPECT_GT(invalid, 1000);
}

TEST(JsonStringTest, EveryByteBelowAndAroundTheControlRange) {
  for (int c = 0; c < 0x80; ++c) {
    const std::string text(1, static_cast<char>(c));
    std::string out;
    ASSERT_TRUE(AppendJsonString(text, &out));
    EXPECT_EQ(out, Reference(text)) << c;
  }
}

// The text-only events (templated) are the bytes nlohmann writes for the document they hold:
// parsing one and dumping it again gives it back, and its content is the text.
TEST(JsonStringTest, OpenAiTextEventsAreNlohmannsBytes) {
  std::mt19937_64 rng(7);
  for (ApiKind kind : {ApiKind::kChatCompletion, ApiKind::kCompletion}) {
    for (bool usage : {false, true}) {
      ResponseHeader header;
      header.kind = kind;
      header.id = "chatcmpl-1";
      header.created = 1796575248;
      header.model = "smol \"quoted\" \xc3\xa9";
      header.system_fingerprint = "fp_1";
      OpenAiWriter writer(header, nullptr, false, "", usage, false, {});
      for (int i = 0; i < 500; ++i) {
        ChoiceOutputs delta;
        delta.text = RandomText(rng);
        if (delta.text.empty()) delta.text = "x";
        const int32_t choice = static_cast<int32_t>(rng() % 3);
        const std::string event = writer.StreamDelta(choice, delta);
        ASSERT_EQ(event.rfind("data: ", 0), 0u);
        ASSERT_GE(event.size(), 8u);
        const std::string body = event.substr(6, event.size() - 8);
        const Json parsed = Json::parse(body);
        ASSERT_EQ(DumpJson(parsed), body) << i;
        const Json& c = parsed["choices"][0];
        EXPECT_EQ(c["index"], choice);
        if (IsValidUtf8(delta.text)) {
          EXPECT_EQ(kind == ApiKind::kChatCompletion ? c["delta"]["content"] : c["text"],
                    delta.text);
        }
        EXPECT_EQ(parsed.contains("usage"), usage);
      }
    }
  }
}

}  // namespace
}  // namespace ferry
