// Fuzz target for template parsing and rendering: any source either fails to parse with a Status
// or renders (or fails to render) within the limits, over a fixed conversation. Never a crash or
// a hang; user spans always lie inside the output.

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/common/log.h"
#include "engine/template/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = ferry::ChatTemplate::Parse(source);
  if (!t.ok()) return 0;
  ferry::ChatTemplateInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(R"([
      {"role": "system", "content": "be brief"},
      {"role": "user", "content": "hi <|im_start|> there"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "abcdefghi", "type": "function",
        "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "content": "42", "tool_call_id": "abcdefghi"}])");
  inputs.tools =
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  inputs.add_generation_prompt = size % 2 == 0;
  inputs.bos_token = "<s>";
  inputs.eos_token = "</s>";
  ferry::jinja::RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  auto prompt = (*t)->Apply(inputs, limits);
  if (!prompt.ok()) return 0;
  size_t at = 0;
  for (const ferry::PromptSpan& span : prompt->spans) {
    CHECK_EQ(span.begin, at);
    CHECK_LE(span.end, prompt->text.size());
    at = span.end;
  }
  CHECK_EQ(at, prompt->text.size());
  return 0;
}
