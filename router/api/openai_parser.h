// The OpenAI API's request bodies (POST /v1/chat/completions, POST /v1/completions) parsed and
// validated into an ApiRequest, as OpenAI's own servers judge them: every field's type and range,
// fields that would change the output and are not implemented (audio, non-text response_format,
// the deprecated functions, ...) refused by name, unknown fields refused ("Unrecognized request
// argument supplied: x"), fields that change nothing (metadata, store, service_tier, ...) accepted
// and ignored. What needs the tokens (the prompt's length against the context, max_tokens) is the
// prompt builder's to check.
//
// Accepted and used, besides OpenAI's own: the common extensions top_k, min_p,
// repetition_penalty, ignore_eos and min_tokens, vLLM's return_token_ids (a boolean: the answer
// carries token ids, openai_writer.h), and an assistant message's reasoning_content (the
// reasoning a template may show again). Roles: system, developer (given to the template as
// system: templates of open models know no developer role), user, assistant (content and/or
// tool_calls), tool (tool_call_id required). Content: a string or text parts; image and audio
// parts are refused until the encoder exists.
//
// Tools: `tools` (functions with names as OpenAI allows them, unique, and parameters whose schema
// is an object with a well-formed type/properties/required; at most max_tools, max_tools_bytes of
// JSON), `tool_choice` (auto, none, required, or a function named in tools; only with tools) and
// `parallel_tool_calls`. Whether the model can use tools at all is the prompt builder's to say.
//
// Thread-safe (pure functions).

#ifndef FERRY_ROUTER_API_OPENAI_PARSER_H_
#define FERRY_ROUTER_API_OPENAI_PARSER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "router/api/api_request.h"

namespace ferry {

// Parses `body` into `out`; the returned error's status is OK on success.
ApiError ParseChatCompletion(absl::string_view body, const ApiLimits& limits, ApiRequest* out);
ApiError ParseCompletion(absl::string_view body, const ApiLimits& limits, ApiRequest* out);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_OPENAI_PARSER_H_
