// The structured-output fields of each API read into an ApiOutputFormat (api_request.h), their
// shapes checked as the API's own servers check them; whether the schema, regex or grammar can be
// enforced is output_constraint.h's to say. Shapes:
//   - OpenAI chat `response_format`: {"type": "text"} | {"type": "json_object"} |
//     {"type": "json_schema", "json_schema": {"name", "schema"?, "strict"?, "description"?}}.
//   - OpenAI Responses `text.format`: {"type": "text"} | {"type": "json_object"} |
//     {"type": "json_schema", "name", "schema", "strict"?, "description"?}.
//   - Anthropic `output_config.format`: {"type": "json_schema", "schema"}.
//   - vLLM's `structured_outputs` (chat and completions): {"json" (a schema, or its JSON text),
//     "regex", "choice" (non-empty strings), "grammar" (GBNF), "json_object": true}, exactly one
//     of them; other vLLM options (backend choice, whitespace pattern, ...) are refused by name.
//     Also vLLM's older top-level `guided_json`, `guided_regex`, `guided_choice`,
//     `guided_grammar`.
// At most one form per request: a second is a 400 naming it.
//
// Pure functions; thread-safe. Errors: ApiError (400) naming the field's path.

#ifndef FERRY_ROUTER_API_OUTPUT_FORMAT_H_
#define FERRY_ROUTER_API_OUTPUT_FORMAT_H_

#include "nlohmann/json.hpp"
#include "router/api/api_request.h"
#include "router/api/request_json.h"

namespace ferry {

// Chat `response_format` (`format` not null).
ApiError ParseChatResponseFormat(const nlohmann::ordered_json& format, ApiOutputFormat* out);

// Responses `text.format` (`format` not null).
ApiError ParseResponsesTextFormat(const nlohmann::ordered_json& format, ApiOutputFormat* out);

// Anthropic `output_config.format` (`format` not null).
ApiError ParseAnthropicOutputFormat(const nlohmann::ordered_json& format, ApiOutputFormat* out);

// vLLM's `structured_outputs` and `guided_*` fields, read from `fields`.
ApiError ParseVllmStructuredOutputs(RequestFields& fields, ApiOutputFormat* out);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_OUTPUT_FORMAT_H_
