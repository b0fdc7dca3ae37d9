// Fuzz target for the API request adapters (OpenAI chat and completions, Anthropic Messages and
// count_tokens, OpenAI Responses) and what the router does with a request that passes: any body
// is refused with a message or becomes an ApiRequest, whose conversation and tools then go to a
// chat template with a tool format and to one without (the Hermes system prompt), never a crash.
// The first byte picks the endpoint (bits 3-4: OpenAI, Messages, count_tokens, Responses; bit 0:
// chat or completions) and the tool setup (bits 1-2); the rest is the body.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/template/chat_template.h"
#include "router/api/anthropic_parser.h"
#include "router/api/openai_parser.h"
#include "router/api/prompt_builder.h"
#include "router/api/response_store.h"
#include "router/api/responses_parser.h"

namespace {

// A Qwen-style template (tools, tool calls with arguments as objects or strings, tool results,
// reasoning), and a plain ChatML one.
constexpr char kToolTemplate[] =
    R"({%- if tools %}{{- 'T:' }}{%- for t in tools %}{{ t | tojson }}{%- endfor %}{%- endif %}
{%- for m in messages %}{{- '<|' + m.role + '|>' }}{%- if m.content is string %}{{ m.content }}{%- endif %}
{%- if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{%- endif %}
{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}:{%- if c.function.arguments is string %}{{ c.function.arguments }}{%- else %}{{ c.function.arguments | tojson }}{%- endif %}</tool_call>{%- endfor %}
{%- if m.tool_call_id %}[{{ m.tool_call_id }}]{%- endif %}{%- endfor %}
{%- if add_generation_prompt %}<|assistant|>{%- endif %})";
constexpr char kPlainTemplate[] =
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}";

const ferry::ChatTemplate& Template(bool tools) {
  static const auto* with = ferry::ChatTemplate::Parse(kToolTemplate)->release();
  static const auto* plain = ferry::ChatTemplate::Parse(kPlainTemplate)->release();
  return tools ? *with : *plain;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const absl::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  ferry::ApiLimits limits;
  limits.model = "m";
  limits.vocab_size = 1000;
  limits.max_messages = 64;
  limits.max_tools_bytes = 4096;
  ferry::ApiRequest request;
  ferry::ApiError error;
  switch ((mode >> 3) & 3) {
    case 0:
      error = (mode & 1) != 0 ? ferry::ParseChatCompletion(body, limits, &request)
                              : ferry::ParseCompletion(body, limits, &request);
      break;
    case 1:
      error = ferry::ParseAnthropicMessages(body, limits, &request);
      break;
    case 2:
      error = ferry::ParseAnthropicCountTokens(body, limits, &request);
      break;
    default: {
      error = ferry::ParseResponses(body, limits, &request);
      if (!error.status.ok()) break;
      static auto* store = new ferry::ResponseStore(ferry::ResponseStoreOptions{});
      std::vector<ferry::ApiMessage> history;
      error = ferry::ResponsesConversation(*store, "t", &request, &history);
      break;
    }
  }
  if (!error.status.ok()) {
    if (error.status.message().empty()) __builtin_trap();  // a refusal always says why
    return 0;
  }
  if (request.kind == ferry::ApiKind::kCompletion) return 0;
  ferry::ToolSetup setup;
  setup.hermes_prompt = (mode & 2) != 0;
  setup.format =
      (mode & 4) != 0 ? ferry::ToolCallFormat::kDeepSeek : ferry::ToolCallFormat::kHermes;
  ferry::jinja::RenderLimits render;
  render.max_output_bytes = 1 << 20;
  (void)Template(!setup.hermes_prompt).Apply(ferry::TemplateInputs(request, setup), render);
  return 0;
}
