#include "router/api/prompt_builder.h"

#include "absl/strings/str_cat.h"
#include "router/api/bounded_json.h"
#include "router/api/reasoning_parser.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

const char* RoleName(ApiRole role) {
  switch (role) {
    case ApiRole::kSystem:
      return "system";
    case ApiRole::kUser:
      return "user";
    case ApiRole::kAssistant:
      return "assistant";
    case ApiRole::kTool:
      return "tool";
  }
  return "user";
}

Json ToolJson(const ApiTool& tool) {
  Json fn = Json::object();
  fn["name"] = tool.name;
  if (!tool.description.empty()) fn["description"] = tool.description;
  fn["parameters"] = tool.parameters;
  if (tool.strict.has_value()) fn["strict"] = *tool.strict;
  return Json{{"type", "function"}, {"function", std::move(fn)}};
}

// Hermes's words for a model whose template has none (Qwen 2.5's template text).
std::string HermesToolPrompt(const std::vector<ApiTool>& tools) {
  std::string out =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
      "provided with function signatures within <tools></tools> XML tags:\n<tools>";
  for (const ApiTool& tool : tools) out += "\n" + ToolJson(tool).dump();
  out +=
      "\n</tools>\n\nFor each function call, return a json object with function name and "
      "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
      "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
  return out;
}

// A call's arguments as the JSON value they are; false when they are not JSON or break the
// default JsonLimits (those of an 8 MiB body: the request's text passed its limits, but not the
// JSON inside this string). Linear time, as the body's parse.
bool ParseArguments(const std::string& arguments, Json* out) {
  return ParseBoundedJson(arguments, JsonLimits{}, out).ok();
}

std::string HermesCallBlock(const ApiToolCall& call) {
  Json args;
  std::string arguments =
      ParseArguments(call.arguments, &args) ? args.dump() : Json(call.arguments).dump();
  return "<tool_call>\n{\"name\": " + Json(call.name).dump() + ", \"arguments\": " + arguments +
         "}\n</tool_call>";
}

}  // namespace

PromptBuilder::PromptBuilder(const Tokenizer* tokenizer, const ChatTemplate* chat_template,
                             ToolSetup tools, std::optional<VisionPromptSetup> vision)
    : tokenizer_(tokenizer),
      chat_template_(chat_template),
      tools_(std::move(tools)),
      vision_(std::move(vision)) {}

std::vector<const ApiImage*> CollectImages(const ApiRequest& request) {
  std::vector<const ApiImage*> images;
  for (const ApiMessage& m : request.messages) {
    for (const ApiContentPart& p : m.content) {
      if (p.image.has_value()) images.push_back(&*p.image);
    }
  }
  return images;
}

ChatTemplateInputs TemplateInputs(const ApiRequest& request, const ToolSetup& setup) {
  ChatTemplateInputs inputs;
  const bool show_tools =
      !request.tools.empty() && request.tool_choice.mode != ApiToolChoice::Mode::kNone;
  const bool hermes = setup.hermes_prompt;
  const bool string_arguments = setup.format == ToolCallFormat::kDeepSeek;
  Json& messages = inputs.messages;
  bool in_results = false;  // hermes: the last message is a user turn of tool results
  for (const ApiMessage& m : request.messages) {
    if (hermes && m.role == ApiRole::kTool) {  // results as <tool_response> blocks of a user turn
      const std::string block = "<tool_response>\n" + m.Text() + "\n</tool_response>";
      if (in_results) {
        messages.back()["content"] = messages.back()["content"].get<std::string>() + "\n" + block;
      } else {
        messages.push_back(Json{{"role", "user"}, {"content", block}});
        in_results = true;
      }
      continue;
    }
    in_results = false;
    Json message = Json::object();
    message["role"] = RoleName(m.role);
    std::string content = m.Text();
    if (hermes && !m.tool_calls.empty()) {
      for (const ApiToolCall& call : m.tool_calls) {
        content += (content.empty() ? "" : "\n") + HermesCallBlock(call);
      }
    }
    if (m.HasImages() && !hermes) {
      // HF's processor convention: a list of {"type": "image"} and {"type": "text"} parts.
      Json parts = Json::array();
      for (const ApiContentPart& p : m.content) {
        if (p.image.has_value()) {
          parts.push_back(Json{{"type", "image"}});
        } else if (!p.text.empty()) {
          parts.push_back(Json{{"type", "text"}, {"text", p.text}});
        }
      }
      message["content"] = std::move(parts);
    } else {
      message["content"] = content;
    }
    if (!m.name.empty()) message["name"] = m.name;
    if (!m.reasoning.empty()) message["reasoning_content"] = m.reasoning;
    if (m.role == ApiRole::kTool) message["tool_call_id"] = m.tool_call_id;
    if (!hermes && !m.tool_calls.empty()) {
      Json calls = Json::array();
      for (const ApiToolCall& call : m.tool_calls) {
        Json arguments = call.arguments;
        if (!string_arguments) {
          Json parsed;
          if (ParseArguments(call.arguments, &parsed) && parsed.is_object()) {
            arguments = std::move(parsed);
          }
        }
        calls.push_back(Json{{"id", call.id},
                             {"type", "function"},
                             {"function", Json{{"name", call.name}, {"arguments", arguments}}}});
      }
      message["tool_calls"] = std::move(calls);
    }
    messages.push_back(std::move(message));
  }
  if (show_tools && hermes) {
    const std::string prompt = HermesToolPrompt(request.tools);
    if (!messages.empty() && messages[0]["role"] == "system") {
      messages[0]["content"] = messages[0]["content"].get<std::string>() + "\n\n" + prompt;
    } else {
      messages.insert(messages.begin(), Json{{"role", "system"}, {"content", prompt}});
    }
  } else if (show_tools) {
    inputs.tools = Json::array();
    for (const ApiTool& tool : request.tools) inputs.tools.push_back(ToolJson(tool));
  }
  inputs.add_generation_prompt = true;
  return inputs;
}

ApiError PromptBuilder::Build(const ApiRequest& request, int64_t context, BuiltPrompt* out) const {
  ChatTemplateInputs inputs;
  if (request.kind != ApiKind::kCompletion) inputs = TemplateInputs(request, tools_);
  if (tokenizer_->bos_id().has_value()) {
    inputs.bos_token = tokenizer_->TokenString(*tokenizer_->bos_id());
  }
  if (tokenizer_->eos_id().has_value()) {
    inputs.eos_token = tokenizer_->TokenString(*tokenizer_->eos_id());
  }
  auto invalid = [](const std::string& param, const std::string& message,
                    const std::string& code = "") {
    return ApiError{absl::InvalidArgumentError(message), param, code};
  };
  const int64_t num_images = static_cast<int64_t>(CollectImages(request).size());
  if (num_images > 0 && !vision_.has_value()) {
    return invalid("messages",
                   "this server's model reads text only: it cannot take images (serve a "
                   "vision-language model, such as a LLaVA-style directory, to send them)",
                   "unsupported_content");
  }
  if (request.kind != ApiKind::kCompletion) {
    if (chat_template_ == nullptr) {
      return invalid("messages", "the model has no chat template; use /v1/completions");
    }
    const bool show_tools =
        !request.tools.empty() && request.tool_choice.mode != ApiToolChoice::Mode::kNone;
    if (show_tools && !tools_.format.has_value()) {
      return invalid("tools",
                     "this model's chat template has no tool-call format, so it cannot be shown "
                     "tools (start ferry-router with --tool_prompt=hermes to describe them in a "
                     "Hermes-style system prompt)",
                     "unsupported_parameter");
    }
    out->tools_rendered = show_tools;
    auto prompt = chat_template_->Apply(inputs);
    if (!prompt.ok()) {
      return invalid("messages", absl::StrCat("the chat template refused the messages: ",
                                              prompt.status().message()));
    }
    out->reasoning_started = ReasoningParser::PromptOpensBlock(prompt->text);
    auto ids = tokenizer_->Encode(PromptSegments(*prompt));
    if (!ids.ok()) return invalid("messages", std::string(ids.status().message()));
    out->tokens = *std::move(ids);
    if (vision_.has_value()) {
      // The prompt's length once each image token is its placeholders (num_images and
      // tokens_per_image are bounded: this does not overflow).
      const int64_t n =
          static_cast<int64_t>(out->tokens.size()) + num_images * (vision_->tokens_per_image - 1);
      if (n >= context) {
        return invalid(
            "messages",
            absl::StrCat("This model's maximum context length is ", context,
                         " tokens. However, your prompt has ", n, " tokens (", num_images,
                         " images of ", vision_->tokens_per_image, " tokens each)."),
            "context_length_exceeded");
      }
      auto expanded = ExpandImagePlaceholders(out->tokens, vision_->image_token,
                                              vision_->tokens_per_image, num_images, n);
      if (!expanded.ok()) {
        return invalid("messages", absl::StrCat("the chat template's image tokens do not match "
                                                "the images: ",
                                                expanded.status().message()));
      }
      out->tokens = std::move(expanded->tokens);
      out->images = std::move(expanded->images);
    }
  } else if (request.prompt_is_ids) {
    out->tokens = request.prompt_ids;
    if (vision_.has_value()) {
      for (TokenId id : out->tokens) {
        if (id == vision_->image_token) {
          return invalid("prompt", absl::StrCat("token id ", id,
                                                " is the model's image placeholder: send images "
                                                "as image parts of a chat request"));
        }
      }
    }
  } else {
    auto ids = tokenizer_->Encode(request.prompt_text);
    if (!ids.ok()) return invalid("prompt", std::string(ids.status().message()));
    out->tokens = *std::move(ids);
  }
  const char* param = request.kind != ApiKind::kCompletion ? "messages" : "prompt";
  const int64_t n = static_cast<int64_t>(out->tokens.size());
  if (n == 0) return invalid(param, "the prompt is empty");
  if (n >= context) {
    return invalid(param,
                   absl::StrCat("This model's maximum context length is ", context,
                                " tokens. However, your prompt has ", n, " tokens."),
                   "context_length_exceeded");
  }
  const int64_t room = context - n;
  if (request.sampling.max_tokens.has_value()) {
    if (*request.sampling.max_tokens > room) {
      return invalid(
          "max_tokens",
          absl::StrCat("This model's maximum context length is ", context,
                       " tokens. However, you requested ", n + *request.sampling.max_tokens,
                       " tokens (", n, " in the prompt, ", *request.sampling.max_tokens,
                       " for the completion)."),
          "context_length_exceeded");
    }
    out->max_tokens = *request.sampling.max_tokens;
  } else {
    out->max_tokens = room;
  }
  if (request.sampling.min_tokens > out->max_tokens) {
    return invalid("min_tokens", "'min_tokens' must not exceed the tokens that fit");
  }
  return ApiError{absl::OkStatus(), "", ""};
}

}  // namespace ferry
