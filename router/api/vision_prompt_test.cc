// A vision-language model's prompts (prompt_builder.h with a VisionPromptSetup, vision_prompt.h):
// messages with images go to the template as content lists, each image token is expanded to the
// model's tokens per image with its span; the refusals: images to a text-only model, a template
// that writes another number of image tokens than there are images, images that overflow the
// context, the image token in completions' ids. And what ReadVisionPromptSetup reads from a
// directory (and refuses).

#include "router/api/vision_prompt.h"

#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "router/api/prompt_builder.h"

namespace ferry {
namespace {

// Characters a..e, a space, and the special token <image> (id 9).
constexpr char kTokenizer[] = R"({
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "d": 3, "e": 4, " ": 5},
            "merges": []},
  "added_tokens": [{"id": 9, "content": "<image>", "special": true, "single_word": false,
                    "lstrip": false, "rstrip": false, "normalized": false}]})";
// Images before the text of their message (llava.jinja's convention).
constexpr char kTemplate[] =
    "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
    "{% for p in m.content %}{% if p.type == 'image' %}<image>{% endif %}{% endfor %}"
    "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}"
    "{% endif %} {% endfor %}";
constexpr char kTextOnlyTemplate[] = "{% for m in messages %}{{ m.content }}{% endfor %}";

ApiMessage User(std::vector<ApiContentPart> parts) {
  ApiMessage m;
  m.role = ApiRole::kUser;
  m.content = std::move(parts);
  return m;
}

ApiContentPart Image(const std::string& bytes) {
  ApiContentPart p;
  p.image.emplace();
  p.image->bytes = bytes;
  return p;
}

ApiContentPart Text(const std::string& text) { return {text, std::nullopt}; }

class VisionPromptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::FromTokenizerJson(kTokenizer);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    auto chat = ChatTemplate::Parse(kTemplate);
    ASSERT_TRUE(chat.ok()) << chat.status();
    template_ = *std::move(chat);
    auto plain = ChatTemplate::Parse(kTextOnlyTemplate);
    ASSERT_TRUE(plain.ok()) << plain.status();
    plain_ = *std::move(plain);
  }

  ApiRequest Request(std::vector<ApiMessage> messages) {
    ApiRequest r;
    r.kind = ApiKind::kChatCompletion;
    r.messages = std::move(messages);
    r.sampling.max_tokens = 1;
    return r;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
  std::unique_ptr<ChatTemplate> plain_;
  const VisionPromptSetup vision_{/*image_token=*/9, /*tokens_per_image=*/3};
};

TEST_F(VisionPromptTest, ImagesBecomeTheirPlaceholders) {
  PromptBuilder builder(tokenizer_.get(), template_.get(), {}, vision_);
  const ApiRequest r = Request(
      {User({Text("ab"), Image("x"), Text("c")}), User({Image("y"), Image("z"), Text("de")})});
  BuiltPrompt p;
  ApiError e = builder.Build(r, 100, &p);
  ASSERT_TRUE(e.status.ok()) << e.status;
  // "<image>abc <image><image>de " with each <image> as 3 placeholders.
  const std::vector<TokenId> want = {9, 9, 9, 0, 1, 2, 5, 9, 9, 9, 9, 9, 9, 3, 4, 5};
  EXPECT_EQ(p.tokens, want);
  ASSERT_EQ(p.images.size(), 3u);
  EXPECT_EQ(p.images[0].start, 0);
  EXPECT_EQ(p.images[1].start, 7);
  EXPECT_EQ(p.images[2].start, 10);
  for (const ImagePlaceholderSpan& s : p.images) EXPECT_EQ(s.length, 3);
  const std::vector<const ApiImage*> images = CollectImages(r);
  ASSERT_EQ(images.size(), 3u);
  EXPECT_EQ(images[0]->bytes, "x");
  EXPECT_EQ(images[2]->bytes, "z");
  // A message without images keeps its content a string.
  const ChatTemplateInputs inputs = TemplateInputs(Request({User({Text("ab")})}), {});
  EXPECT_TRUE(inputs.messages[0]["content"].is_string());
  // "<image>" typed by the user is text, never the image token.
  BuiltPrompt typed;
  e = builder.Build(Request({User({Text("a<image>b")})}), 100, &typed);
  ASSERT_TRUE(e.status.ok()) << e.status;
  for (TokenId t : typed.tokens) EXPECT_NE(t, 9);
  EXPECT_TRUE(typed.images.empty());
}

TEST_F(VisionPromptTest, Refusals) {
  BuiltPrompt p;
  const ApiRequest one = Request({User({Image("x"), Text("ab")})});
  // A text-only model.
  PromptBuilder text_only(tokenizer_.get(), template_.get());
  ApiError e = text_only.Build(one, 100, &p);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.code, "unsupported_content");
  EXPECT_NE(e.status.message().find("reads text only"), absl::string_view::npos) << e.status;
  // A template that writes no image token.
  PromptBuilder plain(tokenizer_.get(), plain_.get(), {}, vision_);
  e = plain.Build(Request({User({Text("ab")}), User({Text("c")})}), 100, &p);
  EXPECT_TRUE(e.status.ok()) << e.status;
  e = plain.Build(Request({User({Text("ab")}), User({Text("c"), Image("x")})}), 100, &p);
  EXPECT_EQ(e.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status.message().find("image tokens do not match"), absl::string_view::npos)
      << e.status;
  // The images overflow the context.
  PromptBuilder builder(tokenizer_.get(), template_.get(), {}, {{9, 1000}});
  e = builder.Build(one, 100, &p);
  EXPECT_EQ(e.code, "context_length_exceeded") << e.status;
  // The image token in completions' token ids.
  ApiRequest ids;
  ids.kind = ApiKind::kCompletion;
  ids.prompt_is_ids = true;
  ids.prompt_ids = {0, 9, 1};
  e = builder.Build(ids, 100, &p);
  EXPECT_EQ(e.param, "prompt");
  EXPECT_NE(e.status.message().find("image placeholder"), absl::string_view::npos) << e.status;
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST_F(VisionPromptTest, ReadVisionPromptSetup) {
  const std::string dir = ::testing::TempDir();
  // No config.json: text only.
  auto setup = ReadVisionPromptSetup(dir, *tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.status();
  EXPECT_FALSE(setup->has_value());
  // A config without vision_config: text only.
  Write(dir + "/config.json", R"({"model_type": "llama"})");
  setup = ReadVisionPromptSetup(dir, *tokenizer_);
  ASSERT_TRUE(setup.ok());
  EXPECT_FALSE(setup->has_value());
  // LLaVA: 56 px, patch 14: 16 tokens per image; the token is <image>.
  const std::string llava = R"({"model_type": "llava", "image_token_index": 9,
      "vision_config": {"model_type": "clip_vision_model", "image_size": 56, "patch_size": 14,
                        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                        "num_attention_heads": 4},
      "text_config": {"hidden_size": 64})";
  Write(dir + "/config.json", llava + "}");
  setup = ReadVisionPromptSetup(dir, *tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.status();
  ASSERT_TRUE(setup->has_value());
  EXPECT_EQ((*setup)->image_token, 9);
  EXPECT_EQ((*setup)->tokens_per_image, 16);
  // image_seq_length that disagrees; an image token that is not a special token.
  Write(dir + "/config.json", llava + R"(, "image_seq_length": 17})");
  EXPECT_FALSE(ReadVisionPromptSetup(dir, *tokenizer_).ok());
  std::string not_special = llava;
  not_special.replace(not_special.find("\"image_token_index\": 9"), 22, "\"image_token_index\": 3");
  Write(dir + "/config.json", not_special + "}");
  EXPECT_FALSE(ReadVisionPromptSetup(dir, *tokenizer_).ok());
  // A GGUF path (a file): text only.
  setup = ReadVisionPromptSetup(dir + "/config.json", *tokenizer_);
  ASSERT_TRUE(setup.ok());
  EXPECT_FALSE(setup->has_value());
}

}  // namespace
}  // namespace ferry
