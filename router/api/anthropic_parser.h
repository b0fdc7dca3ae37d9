// The Anthropic Messages API's request bodies (POST /v1/messages and POST
// /v1/messages/count_tokens) parsed and validated into an ApiRequest, as Anthropic's own servers
// judge them: every field's type and range, unknown fields refused ("x: Extra inputs are not
// permitted"), features that would change the output and are not implemented (images, documents,
// Anthropic's server and client tools, structured output, containers) refused by name, and fields
// that change nothing accepted and ignored (service_tier, inference_geo, speed, diagnostics, the
// thinking configuration, output_config.effort). Error messages start with the offending field's
// path ("messages[1].content[0].input: ..."), which is also the error's `param`.
//
// The conversion onto the internal model (conversation.h):
// - `system` (a string or text blocks) becomes one leading system message, a content part per
//   block. A message of role "system" (the SDK's SystemMessageParam) becomes a system message in
//   its place.
// - A user message's tool_result blocks become one tool message each (tool_call_id, the result's
//   text; `is_error` is accepted and not shown to the model), placed before the rest of the
//   message, whose text blocks become a user message when there are any.
// - An assistant message's text blocks are its content, its tool_use blocks its tool calls
//   (arguments: the compact JSON of `input`, key order kept), its thinking blocks its reasoning
//   (joined); redacted_thinking blocks are dropped (their data is Anthropic's encryption).
// - A final assistant message with no content is dropped; any other message needs some (as
//   Anthropic requires). Text blocks must be non-empty.
// - `tools`: custom tools only (name ^[a-zA-Z0-9_-]{1,64}$, unique; input_schema an object schema,
//   kept with its key order as the tool's parameters). `tool_choice` auto / any (required) / tool
//   (a named tool) / none, and disable_parallel_tool_use (parallel_tool_calls = its negation).
// - cache_control ({"type": "ephemeral", "ttl": "5m" | "1h"}) on tools, system blocks, text,
//   tool_use and tool_result blocks, and at the top level (one more breakpoint): at most 4, and a
//   1h one never after a 5m one (in the order tools, system, messages), as Anthropic checks. Ferry
//   caches every full block of every prompt anyway; the largest ttl given becomes
//   retention_floor_seconds (300 or 3600), how long the KV store keeps this prompt's blocks.
// - `max_tokens` is required (>= 1) for messages, absent from count_tokens; temperature is
//   Anthropic's [0, 1]; top_k 0 is off; sampling.n is always 1; metadata.user_id is the user.
//
// The body is untrusted: any input gets an ApiError or an ApiRequest, never a crash (JSON nested
// deeper than 128 levels is refused before anything recurses over it).
//
// Thread-safe (pure functions).

#ifndef FERRY_ROUTER_API_ANTHROPIC_PARSER_H_
#define FERRY_ROUTER_API_ANTHROPIC_PARSER_H_

#include "absl/strings/string_view.h"
#include "router/api/api_request.h"
#include "router/api/openai_parser.h"  // ApiLimits

namespace ferry {

// POST /v1/messages. Parses `body` into `out` (out->kind = ApiKind::kMessages); the returned
// error's status is OK on success. On failure `out` holds whatever was parsed before the error.
ApiError ParseAnthropicMessages(absl::string_view body, const ApiLimits& limits, ApiRequest* out);

// POST /v1/messages/count_tokens: model, messages, system, tools, tool_choice, thinking,
// cache_control, output_config and speed, validated as for messages (no max_tokens, no sampling
// fields, no stream). out->kind = ApiKind::kMessages; out->sampling.max_tokens stays unset.
ApiError ParseAnthropicCountTokens(absl::string_view body, const ApiLimits& limits,
                                   ApiRequest* out);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_ANTHROPIC_PARSER_H_
