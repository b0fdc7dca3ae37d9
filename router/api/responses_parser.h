// The OpenAI Responses API's request body (POST /v1/responses) parsed and validated into an
// ApiRequest (kind kResponses), the same internal model the chat adapter fills (STYLE.md §15):
// the router then prepends the instructions and the stored conversation (ResponsesConversation in
// response_store.h), builds the prompt, and writes the answer with ResponsesWriter.
//
// `input` is a string (one user message) or a list of items, converted into messages:
//   - message items ({"role", "content"}, "type": "message" optional): roles user, assistant,
//     system, developer (given to the template as system, as the chat adapter does); content a
//     string or parts input_text / output_text / refusal (text). Image, file and audio parts are
//     refused until the encoder exists.
//   - function_call items become the tool_calls of an assistant message (consecutive calls, and a
//     call right after an assistant message, join that message); function_call_output items
//     become tool messages (tool_call_id = call_id).
//   - reasoning items become the `reasoning` of the assistant message that follows (or, when none
//     follows, of the one before; or of an assistant message of their own). Their content
//     (reasoning_text) is used, else their summary; encrypted_content, which only OpenAI can
//     read, is ignored.
//   - item_reference (which needs a server-side item store) and every other item type are refused
//     by name.
// Output items a client got from a response (ids, status, annotations) are accepted as input, so
// the SDK's `input += response.output` works.
//
// Fields: model (as the chat adapter: 404 model_not_found when it is not the served model),
// input, instructions, previous_response_id ("resp_..."), store (default true), metadata (at most
// 16 string values; keys up to 64 characters, values up to 512: OpenAI's limits), user,
// max_output_tokens (>= 1: OpenAI's own minimum is 16, but the chat endpoints take 1 and small
// limits are what tests and cheap probes use, so this server takes what chat takes),
// temperature [0, 2], top_p (0, 1], stream, stream_options.include_obfuscation (accepted; no
// obfuscation padding is sent), tools (functions in the Responses' flat form; every other tool
// type is refused by name; at most max_tools, max_tools_bytes of JSON), tool_choice (auto, none,
// required, or {"type": "function", "name"} of a listed tool), parallel_tool_calls.
// Accepted without effect: reasoning ({effort, summary, ...}), text.format {"type": "text"} and
// text.verbosity, truncation "disabled", include (OpenAI's known values), background false,
// prompt_cache_key, prompt_cache_retention, prompt_cache_options, service_tier,
// safety_identifier, max_tool_calls (it bounds built-in tools, which this server has none of),
// top_logprobs 0. Refused as not supported (400, code unsupported_parameter): text formats
// json_schema / json_object (until constrained decoding), truncation "auto" (the prompt builder
// refuses a prompt that does not fit instead of dropping items), background true, top_logprobs
// above 0 and include "message.output_text.logprobs" (the Responses writer writes no logprobs),
// conversation, prompt, context_management and the other server-side features. Unknown fields:
// 400 "Unrecognized request argument supplied: x". sampling.n is always 1.
//
// Thread-safe (a pure function).

#ifndef FERRY_ROUTER_API_RESPONSES_PARSER_H_
#define FERRY_ROUTER_API_RESPONSES_PARSER_H_

#include "absl/strings/string_view.h"
#include "router/api/api_request.h"
#include "router/api/openai_parser.h"

namespace ferry {

// Parses `body` into `out` (kind kResponses; `messages` holds the request's own input only); the
// returned error's status is OK on success, else InvalidArgument (400) or NotFound (404, the
// model) with the offending field in `param`.
ApiError ParseResponses(absl::string_view body, const ApiLimits& limits, ApiRequest* out);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_RESPONSES_PARSER_H_
