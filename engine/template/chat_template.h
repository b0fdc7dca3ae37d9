// apply_chat_template in C++: renders a model's own chat template (its Jinja source from
// tokenizer_config.json or GGUF metadata) over a conversation, as HF transformers does, and says
// which bytes of the prompt came from users, so the tokenizer can keep user text from producing
// control tokens.
//
// Immutable after Parse(); thread-safe.

#ifndef FERRY_ENGINE_TEMPLATE_CHAT_TEMPLATE_H_
#define FERRY_ENGINE_TEMPLATE_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/template/template.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

namespace ferry {

// JSON with object keys in their original order (parse request bodies as ordered_json: templates
// print tool schemas and arguments with tojson, and HF keeps the client's key order).
struct ChatTemplateInputs {
  // [{"role": ..., "content": ... , "tool_calls": [...], ...}, ...] as the OpenAI API sends it.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  // Tool definitions (JSON schema objects), or null.
  nlohmann::ordered_json tools = nullptr;
  bool add_generation_prompt = false;
  std::string bos_token;
  std::string eos_token;
  // Further template variables (e.g. {"enable_thinking": false}).
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
};

// A byte range of the prompt and where it came from.
struct PromptSpan {
  size_t begin;
  size_t end;
  bool user;  // from message contents, tool calls and results, tool definitions, extra strings
};

struct ChatPrompt {
  std::string text;
  // Cover `text` in order; template spans may hold control tokens, user spans never.
  std::vector<PromptSpan> spans;
};

// The prompt as tokenizer segments: template spans may produce special tokens, user spans not.
// The segments point into prompt.text.
std::vector<TextSegment> PromptSegments(const ChatPrompt& prompt);

class GgufFile;

class ChatTemplate {
 public:
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Parse(absl::string_view source);
  // The template of a GGUF file (tokenizer.chat_template).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromGguf(const GgufFile& gguf);
  // The template of an HF tokenizer_config.json: "chat_template" as a string, or as a list of
  // {"name", "template"} from which `name` is chosen ("default" unless told otherwise).
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromTokenizerConfig(
      absl::string_view json, absl::string_view name = "default");

  absl::StatusOr<ChatPrompt> Apply(const ChatTemplateInputs& inputs,
                                   const jinja::RenderLimits& limits = {}) const;

  // The Jinja source (callers look for a model's tool-call and reasoning markers in it).
  const std::string& source() const { return source_; }

 private:
  ChatTemplate(std::unique_ptr<jinja::Template> t, std::string source)
      : template_(std::move(t)), source_(std::move(source)) {}
  std::unique_ptr<jinja::Template> template_;
  std::string source_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TEMPLATE_CHAT_TEMPLATE_H_
