#include "engine/template/chat_template.h"

#include <map>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/gguf/gguf_file.h"

namespace ferry {

using jinja::Value;

namespace {

// Message fields are user text, except the role, which the front door validates.
Value MessageValue(const nlohmann::ordered_json& message) {
  if (!message.is_object()) return Value::FromJson(message, /*user=*/true);
  jinja::Dict fields;
  for (auto it = message.begin(); it != message.end(); ++it) {
    fields.emplace_back(it.key(), Value::FromJson(it.value(), /*user=*/it.key() != "role"));
  }
  return Value::MakeDict(std::move(fields));
}

}  // namespace

std::vector<TextSegment> PromptSegments(const ChatPrompt& prompt) {
  std::vector<TextSegment> segments;
  segments.reserve(prompt.spans.size());
  for (const PromptSpan& span : prompt.spans) {
    segments.push_back({absl::string_view(prompt.text).substr(span.begin, span.end - span.begin),
                        /*allow_special=*/!span.user});
  }
  return segments;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Parse(absl::string_view source) {
  ASSIGN_OR_RETURN(std::unique_ptr<jinja::Template> t, jinja::Template::Parse(source));
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::move(t), std::string(source)));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromGguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(const std::string source, gguf.GetString("tokenizer.chat_template"));
  return Parse(source);
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromTokenizerConfig(
    absl::string_view json, absl::string_view name) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", e.what()));
  }
  if (!config.is_object() || !config.contains("chat_template")) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) return Parse(t.get<std::string>());
  if (t.is_array()) {
    for (const nlohmann::json& entry : t) {
      if (entry.is_object() && entry.value("name", "") == name && entry.contains("template") &&
          entry["template"].is_string()) {
        return Parse(entry["template"].get<std::string>());
      }
    }
    return absl::NotFoundError(
        absl::StrCat("tokenizer_config.json has no chat template named '", name, "'"));
  }
  return absl::InvalidArgumentError("tokenizer_config.json: chat_template is not a string or list");
}

absl::StatusOr<ChatPrompt> ChatTemplate::Apply(const ChatTemplateInputs& inputs,
                                               const jinja::RenderLimits& limits) const {
  if (!inputs.messages.is_array()) return absl::InvalidArgumentError("messages must be an array");
  std::map<std::string, Value> context;
  jinja::List messages;
  for (const nlohmann::ordered_json& m : inputs.messages) messages.push_back(MessageValue(m));
  context["messages"] = Value::MakeList(std::move(messages));
  context["tools"] = Value::FromJson(inputs.tools, /*user=*/true);
  context["documents"] = Value::None();
  context["add_generation_prompt"] = Value::Bool(inputs.add_generation_prompt);
  context["bos_token"] = Value::String(inputs.bos_token);
  context["eos_token"] = Value::String(inputs.eos_token);
  if (inputs.extra.is_object()) {
    for (auto it = inputs.extra.begin(); it != inputs.extra.end(); ++it) {
      context[it.key()] = Value::FromJson(it.value(), /*user=*/true);
    }
  }
  ASSIGN_OR_RETURN(jinja::Rendered rendered, template_->Render(context, limits));
  ChatPrompt prompt;
  prompt.text = std::move(rendered.text);
  size_t at = 0;
  for (const jinja::UserSpan& span : rendered.user_spans) {
    if (span.begin > at) prompt.spans.push_back({at, span.begin, false});
    prompt.spans.push_back({span.begin, span.end, true});
    at = span.end;
  }
  if (at < prompt.text.size()) prompt.spans.push_back({at, prompt.text.size(), false});
  return prompt;
}

}  // namespace ferry
