// Images in the three API adapters (image_part.h): what each takes (OpenAI's image_url part in
// both forms, with detail; Anthropic's base64 and url sources, also inside a tool result;
// Responses' input_image), the bytes and media type they become, the order of parts kept, and a
// table of refusals per API, each a 400 naming its field: bad base64, a data: URL that is not
// base64, a media type that is not an image, another scheme, a remote URL while the server
// fetches none, a truncated header, a decompression bomb (dimensions over the pixel cap), too many
// images, an image over the byte limit, an image where the API allows none, a Files API id.

#include "router/api/image_part.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "router/api/anthropic_parser.h"
#include "router/api/openai_parser.h"
#include "router/api/responses_parser.h"

namespace ferry {
namespace {

// A 2x2 RGB PNG; its first 20 bytes (a header cut short); a PNG whose header says 16000 x 16000
// (256 Mpx: over the 50 Mpx cap) with a few bytes of data (made with Python's zlib).
constexpr char kPng[] =
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAEElEQVR4nGNocFAAIgYIBQAaDgOBnA45xwAAAABJRU5Er"
    "kJggg==";
constexpr char kTruncated[] = "iVBORw0KGgoAAAANSUhEUgAAAAI=";
constexpr char kBomb[] =
    "iVBORw0KGgoAAAANSUhEUgAAPoAAAD6ACAIAAADOHEiJAAAADElEQVR4nGNgoD0AAABkAAGGZDw1AAAAAElFTkSuQmCC";

ApiLimits Limits() {
  ApiLimits l;
  l.model = "tiny";
  l.vocab_size = 512;
  l.max_images = 2;
  l.max_image_bytes = 4096;
  return l;
}

std::string Png() {
  std::string bytes;
  EXPECT_TRUE(absl::Base64Unescape(kPng, &bytes));
  return bytes;
}

std::string DataUrl(const std::string& b64, const std::string& type = "image/png") {
  return absl::StrCat("data:", type, ";base64,", b64);
}

std::string OpenAi(const std::string& parts) {
  return absl::StrCat(R"({"model":"tiny","messages":[{"role":"user","content":[)", parts, "]}]}");
}
std::string OpenAiImage(const std::string& url) {
  return OpenAi(absl::StrCat(R"({"type":"image_url","image_url":{"url":")", url, R"("}})"));
}
std::string Anthropic(const std::string& blocks) {
  return absl::StrCat(R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":[)",
                      blocks, "]}]}");
}
std::string AnthropicBase64(const std::string& data, const std::string& type = "image/png") {
  return Anthropic(absl::StrCat(R"({"type":"image","source":{"type":"base64","media_type":")", type,
                                R"(","data":")", data, R"("}})"));
}
std::string Responses(const std::string& parts) {
  return absl::StrCat(R"({"model":"tiny","input":[{"role":"user","content":[)", parts, "]}]}");
}
std::string ResponsesImage(const std::string& url) {
  return Responses(absl::StrCat(R"({"type":"input_image","image_url":")", url, R"("})"));
}

TEST(ImagePartTest, OpenAiImageUrlParts) {
  ApiRequest r;
  ApiError e = ParseChatCompletion(
      OpenAi(absl::StrCat(R"({"type":"text","text":"Look: "},)",
                          R"({"type":"image_url","image_url":{"url":")", DataUrl(kPng),
                          R"(","detail":"low"}},{"type":"text","text":"and "},)",
                          R"({"type":"image_url","image_url":")", DataUrl(kPng, "image/PNG"),
                          R"("},{"type":"text","text":"that."})")),
      Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  ASSERT_EQ(r.messages.size(), 1u);
  const auto& c = r.messages[0].content;
  ASSERT_EQ(c.size(), 5u);
  EXPECT_EQ(c[0].text, "Look: ");
  ASSERT_TRUE(c[1].image.has_value());
  EXPECT_EQ(c[1].image->bytes, Png());
  EXPECT_EQ(c[1].image->media_type, "image/png");
  EXPECT_EQ(c[1].image->param, "messages[0].content[1].image_url");
  EXPECT_EQ(c[2].text, "and ");
  ASSERT_TRUE(c[3].image.has_value());  // the older form: the URL as a string
  EXPECT_EQ(c[3].image->bytes, Png());
  EXPECT_EQ(c[4].text, "that.");
  EXPECT_EQ(r.messages[0].Text(), "Look: and that.");
  EXPECT_EQ(CountImages(r.messages), 2);
}

TEST(ImagePartTest, AnthropicImageBlocks) {
  ApiRequest r;
  ApiError e = ParseAnthropicMessages(
      absl::StrCat(
          R"({"model":"tiny","max_tokens":8,"messages":[{"role":"user","content":[)",
          R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":")", kPng,
          R"("},"cache_control":{"type":"ephemeral"}},{"type":"text","text":"What?"},)",
          R"({"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"shot"},)",
          R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":")", kPng,
          R"("}}]}]}]})"),
      Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  ASSERT_EQ(r.messages.size(), 2u);  // the tool result first, then the user's own blocks
  EXPECT_EQ(r.messages[0].role, ApiRole::kTool);
  ASSERT_EQ(r.messages[0].content.size(), 2u);
  EXPECT_EQ(r.messages[0].content[1].image->bytes, Png());
  EXPECT_EQ(r.messages[1].content[0].image->bytes, Png());
  EXPECT_EQ(r.messages[1].content[1].text, "What?");
  // count_tokens takes the same blocks.
  ApiRequest count;
  ApiError counted = ParseAnthropicCountTokens(
      absl::StrCat(R"({"model":"tiny","messages":[{"role":"user","content":[)",
                   R"({"type":"image","source":{"type":"base64","media_type":"image/png","data":")",
                   kPng, R"("}}]}]})"),
      Limits(), &count);
  EXPECT_TRUE(counted.status.ok()) << counted.status;
  EXPECT_EQ(CountImages(count.messages), 1);
}

TEST(ImagePartTest, ResponsesInputImage) {
  ApiRequest r;
  ApiError e = ParseResponses(Responses(absl::StrCat(R"({"type":"input_text","text":"Describe "},)",
                                                     R"({"type":"input_image","image_url":")",
                                                     DataUrl(kPng), R"(","detail":"auto"})")),
                              Limits(), &r);
  ASSERT_TRUE(e.status.ok()) << e.status << " " << e.param;
  ASSERT_EQ(r.messages[0].content.size(), 2u);
  EXPECT_EQ(r.messages[0].content[0].text, "Describe ");
  EXPECT_EQ(r.messages[0].content[1].image->bytes, Png());
}

struct Bad {
  std::string body;
  std::string param;
  std::string code;     // OpenAI's error code ("" for Anthropic's, which has none)
  std::string message;  // a piece of the message
};

void ExpectRefused(ApiError (*parse)(absl::string_view, const ApiLimits&, ApiRequest*),
                   const Bad& c) {
  ApiRequest r;
  ApiError e = parse(c.body, Limits(), &r);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument) << c.body.substr(0, 300);
  EXPECT_EQ(e.param, c.param) << c.body.substr(0, 300) << "\n" << e.status;
  if (!c.code.empty()) EXPECT_EQ(e.code, c.code) << c.body.substr(0, 300);
  EXPECT_NE(std::string(e.status.message()).find(c.message), std::string::npos)
      << e.status << "\nwanted: " << c.message;
}

std::string Many(int n) {
  std::string parts;
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&parts, i ? "," : "", R"({"type":"image_url","image_url":{"url":")",
                    DataUrl(kPng), R"("}})");
  }
  return OpenAi(parts);
}

TEST(ImagePartTest, OpenAiRefusals) {
  const std::string p = "messages[0].content[0].image_url";
  const std::string big(8192, 'A');  // 6144 bytes decoded: over the 4096 of Limits()
  const Bad cases[] = {
      {OpenAiImage(DataUrl("!!!not base64!!!")), p, "invalid_image_format", "not valid base64"},
      {OpenAiImage("data:image/png," + std::string(kPng)), p, "invalid_image_url", "base64"},
      {OpenAiImage(DataUrl(kPng, "text/plain")), p, "invalid_image_format",
       "not an image media type"},
      {OpenAiImage(DataUrl(kPng, "")), p, "invalid_image_format", "not an image media type"},
      {OpenAiImage("ftp://example.com/a.png"), p, "invalid_image_url", "not 'ftp:'"},
      {OpenAiImage("https://example.com/a.png"), p, "remote_images_disabled", "--image_url_hosts"},
      {OpenAiImage(DataUrl(kTruncated)), p, "invalid_image", "cannot be used"},
      {OpenAiImage(DataUrl(kBomb)), p, "invalid_image", "cannot be used"},
      {OpenAiImage(DataUrl(big)), p, "image_too_large", "at most 4096 bytes per image"},
      {Many(3), "messages", "too_many_images", "3 images; at most 2"},
      {OpenAi(R"({"type":"image_url"})"), p, "", "needs 'image_url'"},
      {OpenAi(R"({"type":"image_url","image_url":{"url":"x","detail":"max"}})"), p + ".detail", "",
       "'detail'"},
      {absl::StrCat(R"({"model":"tiny","messages":[{"role":"system","content":[)",
                    R"({"type":"image_url","image_url":{"url":")", DataUrl(kPng), R"("}}]}]})"),
       "messages[0].content[0].image_url", "unsupported_content", "user messages only"},
  };
  for (const Bad& c : cases) ExpectRefused(&ParseChatCompletion, c);
}

TEST(ImagePartTest, AnthropicRefusals) {
  const std::string p = "messages[0].content[0].source";
  const Bad cases[] = {
      {AnthropicBase64("%%%"), p, "", "messages[0].content[0].source: the image's data is not"},
      {AnthropicBase64(kPng, "application/pdf"), p, "", "not an image media type"},
      {AnthropicBase64(kTruncated), p, "", "cannot be used"},
      {AnthropicBase64(kBomb), p, "", "cannot be used"},
      {AnthropicBase64(std::string(8192, 'A')), p, "", "per image"},
      {Anthropic(R"({"type":"image","source":{"type":"url","url":"https://example.com/a.png"}})"),
       p, "", "--image_url_hosts"},
      {Anthropic(R"({"type":"image","source":{"type":"url","url":"file:///etc/passwd"}})"),
       p + ".url", "", "http(s) URL"},
      {Anthropic(R"({"type":"image","source":{"type":"file","file_id":"f"}})"), p + ".type", "",
       "Files API"},
      {Anthropic(R"({"type":"image","source":{"type":"base64","media_type":"image/png"}})"),
       p + ".data", "", "Field required"},
  };
  for (const Bad& c : cases) ExpectRefused(&ParseAnthropicMessages, c);
}

TEST(ImagePartTest, ResponsesRefusals) {
  const std::string p = "input[0].content[0]";
  const Bad cases[] = {
      {ResponsesImage(DataUrl("@@")), p + ".image_url", "invalid_image_format", "base64"},
      {ResponsesImage(DataUrl(kTruncated)), p + ".image_url", "invalid_image", "cannot be used"},
      {ResponsesImage(DataUrl(kBomb)), p + ".image_url", "invalid_image", "cannot be used"},
      {ResponsesImage("http://169.254.169.254/latest"), p + ".image_url", "remote_images_disabled",
       "disabled"},
      {Responses(R"({"type":"input_image","file_id":"file-1"})"), p + ".file_id",
       "unsupported_content", "Files API"},
      {absl::StrCat(R"({"model":"tiny","input":[{"role":"assistant","content":[)",
                    R"({"type":"input_image","image_url":")", DataUrl(kPng), R"("}]}]})"),
       p + ".type", "unsupported_content", "user messages only"},
  };
  for (const Bad& c : cases) ExpectRefused(&ParseResponses, c);
}

}  // namespace
}  // namespace ferry
