// The prompt of an API request as token ids (ARCHITECTURE.md §3 step 1): chat messages rendered
// with the model's own chat template and tokenized with user text kept as text (a special-token
// string inside a message never becomes a control token: PromptSegments); completions' text
// tokenized as plain text, or their token ids taken as they are. Then the lengths are checked:
// the prompt must leave room in the model's context for the tokens asked for.
//
// Tools. The conversation (conversation.h) goes to the template as HF's apply_chat_template takes
// it: OpenAI-shaped messages, assistant tool_calls with their arguments as a JSON object (as a
// string for DeepSeek's templates, which concatenate it), tool results with their tool_call_id,
// and `tools` as OpenAI's function definitions. A template with no tool format (ToolSetup.format
// unset) cannot show a model its tools: such a request is refused (400, param "tools"), unless
// ToolSetup.hermes_prompt, where the builder itself writes the tools into the system message in
// Hermes's words (the text Qwen 2.5's template uses: the functions' JSON inside <tools></tools>,
// and the instruction to answer with <tool_call>{"name": ..., "arguments": ...}</tool_call>),
// renders earlier calls as such blocks in the assistant's content and tool results as
// <tool_response> blocks in a user message. tool_choice "none" renders no tools.
//
// Images (VisionPromptSetup: a LLaVA-style model). A message with image parts goes to the template
// with its content as a list of parts, as HF's processors take it: {"type": "image"} and
// {"type": "text", "text": ...} in the message's order (messages without images keep their content
// a string); the template writes each image's token (llava.jinja: "<image>"), the prompt is
// tokenized, and each image token is expanded to the model's tokens_per_image placeholders
// (ExpandImagePlaceholders, as transformers' LlavaProcessor does). BuiltPrompt.images are the
// spans, in prompt order, which is the order of the request's image parts (messages in order):
// the template must write one image token per image in that order, or the request is a 400.
// Images to a builder without a VisionPromptSetup (a text-only model) are a 400.
//
// Thread-safe (immutable after construction).

#ifndef FERRY_ROUTER_API_PROMPT_BUILDER_H_
#define FERRY_ROUTER_API_PROMPT_BUILDER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/vision/image_placeholders.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/api/api_request.h"
#include "router/api/tool_call_parser.h"
#include "router/api/vision_prompt.h"

namespace ferry {

struct BuiltPrompt {
  std::vector<TokenId> tokens;  // image tokens expanded to their placeholders
  // The images' placeholder spans in `tokens`, in prompt order: the request's image parts in
  // their order (CollectImages).
  std::vector<ImagePlaceholderSpan> images;
  int64_t max_tokens = 0;       // what the request may generate (asked, or what the context leaves)
  bool tools_rendered = false;  // the model was shown tools: its reply is parsed for calls
  bool reasoning_started = false;  // the prompt ends inside an open <think> block
};

// How a model's tools are written and read (from its template's markers, or flags).
struct ToolSetup {
  std::optional<ToolCallFormat> format;  // the parser; unset: the template has no tool format
  bool hermes_prompt = false;            // the builder writes the tools (and the format is Hermes)
};

// A chat request's messages and tools as the chat template takes them (what Build renders, but
// for the bos/eos strings, which come from the tokenizer).
ChatTemplateInputs TemplateInputs(const ApiRequest& request, const ToolSetup& tools);

// The request's images in prompt order (its messages' image parts in order); pointers into
// `request`.
std::vector<const ApiImage*> CollectImages(const ApiRequest& request);

class PromptBuilder {
 public:
  // `chat_template` may be null (then chat requests are refused). Both must outlive the builder.
  PromptBuilder(const Tokenizer* tokenizer, const ChatTemplate* chat_template, ToolSetup tools = {},
                std::optional<VisionPromptSetup> vision = std::nullopt);

  // `context` is the model's positions. Errors: 400 with `param` (messages, prompt, max_tokens)
  // and code context_length_exceeded where the lengths do not fit.
  ApiError Build(const ApiRequest& request, int64_t context, BuiltPrompt* out) const;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const ToolSetup& tool_setup() const { return tools_; }
  const std::optional<VisionPromptSetup>& vision() const { return vision_; }

 private:
  const Tokenizer* const tokenizer_;
  const ChatTemplate* const chat_template_;
  const ToolSetup tools_;
  const std::optional<VisionPromptSetup> vision_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_PROMPT_BUILDER_H_
