// OpenAI's response bodies and stream chunks, field for field, from what the workers returned:
// chat.completion / chat.completion.chunk and text_completion objects with their ids, `created`,
// `model`, `system_fingerprint`, choices (message or delta, logprobs, finish_reason) and usage
// (with prompt_tokens_details.cached_tokens and completion_tokens_details.reasoning_tokens); SSE
// framing ("data: ...\n\n", "data: [DONE]"). A chat message carries `tool_calls` (content null
// when the model only called tools) and `reasoning_content` (vLLM's and DeepSeek's name) when the
// model reasoned; a delta carries the pieces of each (delta.tool_calls: the call's index, its id,
// type and name in its first piece, then arguments text).
//
// Token strings for logprobs come from the router's tokenizer: `token` is the token's text
// (U+FFFD where it is part of a character), `bytes` its raw bytes.
//
// With return_token_ids (vLLM's extension) each choice also carries, after finish_reason, its
// generated token ids as the workers sent them (`token_ids`, a stop token included when the
// worker emitted one) and the prompt's (`prompt_token_ids`: what the worker ran, after the chat
// template). Streamed, every chunk of a choice carries `token_ids`: the ids of the tokens it adds
// ([] in the first chunk), so that a stream's lists concatenate to the whole answer's; the first
// chunk of each choice (chat: the role chunk; completions: a chunk with the echoed prompt or "")
// carries `prompt_token_ids`. Without it, nothing of either appears.
//
// Thread-compatible (pure functions, and an accumulator per response).

#ifndef FERRY_ROUTER_API_OPENAI_WRITER_H_
#define FERRY_ROUTER_API_OPENAI_WRITER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/token_id.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/api/api_request.h"
#include "router/api/api_writer.h"
#include "router/api/conversation.h"

namespace ferry {

// What every object of one response shares.
struct ResponseHeader {
  ApiKind kind = ApiKind::kChatCompletion;
  std::string id;  // "chatcmpl-..." / "cmpl-..."
  int64_t created = 0;
  std::string model;
  std::string system_fingerprint;
};

class OpenAiWriter final : public ApiWriter {
 public:
  // `tokenizer` must outlive the writer; `echo_prompt` is prepended to completions' text (echo);
  // `include_usage`: stream_options.include_usage (every chunk has "usage": null, and a last
  // chunk carries the usage); `return_token_ids`: the choices carry token ids, the prompt's being
  // `prompt_token_ids`.
  OpenAiWriter(ResponseHeader header, const Tokenizer* tokenizer, bool logprobs,
               std::string echo_prompt = "", bool include_usage = false,
               bool return_token_ids = false, std::vector<TokenId> prompt_token_ids = {});

  // The whole non-streaming body.
  std::string Full(const std::vector<ChoiceOutputs>& choices, const UsageCounts& usage) override;

  // Stream events (each a complete "data: ...\n\n").
  // The first chunk of a chat choice (role, empty content); for completions the echoed prompt,
  // or with return_token_ids an empty text; else "".
  std::string StreamStart(int32_t choice) override;
  // Text and tokens that became final for `choice`, and its finish reason when it ended.
  std::string StreamDelta(int32_t choice, const ChoiceOutputs& delta) override;
  // The usage chunk (with include_usage), then "data: [DONE]".
  std::string StreamEnd(const std::vector<ChoiceOutputs>& choices,
                        const UsageCounts& usage) override;
  // OpenAI's error body as an event (the stream ends after it, without [DONE]).
  std::string StreamError(const ApiError& error, const std::string& trace_id) override;

 private:
  nlohmann::ordered_json Object(bool chunk) const;
  nlohmann::ordered_json Logprobs(const ChoiceOutputs& c, int64_t text_offset) const;
  nlohmann::ordered_json Usage(const UsageCounts& u) const;
  nlohmann::ordered_json TokenEntry(TokenId token, float logprob) const;
  // StreamDelta as a JSON document built and dumped (every case; the text-only one also goes
  // through the choice's template).
  std::string StreamDeltaDocument(int32_t choice, const ChoiceOutputs& delta);

  // A choice's text-only event: the bytes before and after its text's JSON string.
  struct TextTemplate {
    bool built = false, usable = false;
    std::string prefix, suffix;
  };
  std::vector<TextTemplate> text_templates_;

  const ResponseHeader header_;
  const Tokenizer* const tokenizer_;
  const bool logprobs_;
  const std::string echo_prompt_;
  const bool include_usage_;
  const bool return_token_ids_;
  const std::vector<TokenId> prompt_token_ids_;
};

// JSON as OpenAI serializes it (UTF-8, nothing escaped beyond what JSON needs; invalid UTF-8
// from a model replaced by U+FFFD).
std::string DumpJson(const nlohmann::ordered_json& json);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_OPENAI_WRITER_H_
