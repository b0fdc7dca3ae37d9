#include "router/api/prompt_builder.h"

#include "absl/strings/str_cat.h"

namespace ferry {

PromptBuilder::PromptBuilder(const Tokenizer* tokenizer, const ChatTemplate* chat_template)
    : tokenizer_(tokenizer), chat_template_(chat_template) {}

ApiError PromptBuilder::Build(const ApiRequest& request, int64_t context, BuiltPrompt* out) const {
  auto invalid = [](const std::string& param, const std::string& message,
                    const std::string& code = "") {
    return ApiError{absl::InvalidArgumentError(message), param, code};
  };
  if (request.kind == ApiKind::kChatCompletion) {
    if (chat_template_ == nullptr) {
      return invalid("messages", "the model has no chat template; use /v1/completions");
    }
    ChatTemplateInputs inputs;
    inputs.messages = request.messages;
    inputs.add_generation_prompt = true;
    if (tokenizer_->bos_id().has_value()) {
      inputs.bos_token = tokenizer_->TokenString(*tokenizer_->bos_id());
    }
    if (tokenizer_->eos_id().has_value()) {
      inputs.eos_token = tokenizer_->TokenString(*tokenizer_->eos_id());
    }
    auto prompt = chat_template_->Apply(inputs);
    if (!prompt.ok()) {
      return invalid("messages", absl::StrCat("the chat template refused the messages: ",
                                              prompt.status().message()));
    }
    auto ids = tokenizer_->Encode(PromptSegments(*prompt));
    if (!ids.ok()) return invalid("messages", std::string(ids.status().message()));
    out->tokens = *std::move(ids);
  } else if (request.prompt_is_ids) {
    out->tokens = request.prompt_ids;
  } else {
    auto ids = tokenizer_->Encode(request.prompt_text);
    if (!ids.ok()) return invalid("prompt", std::string(ids.status().message()));
    out->tokens = *std::move(ids);
  }
  const char* param = request.kind == ApiKind::kChatCompletion ? "messages" : "prompt";
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
