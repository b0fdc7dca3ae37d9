// One API request after parsing and validation, in the router's own terms (conversation.h: every
// API is an adapter onto one internal model). The adapters fill it from a JSON body: OpenAI chat
// and completions (openai_parser.h), Anthropic Messages (anthropic_parser.h), OpenAI Responses
// (responses_parser.h). The prompt builder turns its messages and tools, or its prompt, into
// tokens; the dispatcher sends it to a worker.

#ifndef FERRY_ROUTER_API_API_REQUEST_H_
#define FERRY_ROUTER_API_API_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/common/token_id.h"
#include "media/image/image.h"
#include "router/api/bounded_json.h"
#include "router/api/conversation.h"

namespace ferry {

// The endpoint a request came by: which adapter parses it and writes its answer.
enum class ApiKind { kChatCompletion, kCompletion, kMessages, kResponses };

struct ApiSampling {
  std::optional<int64_t> max_tokens;  // unset: what the context leaves
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::vector<std::pair<TokenId, float>> logit_bias;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;  // unset: the router picks one
  int32_t n = 1;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool ignore_eos = false;
  int64_t min_tokens = 0;
};

// Structured output as the request asked for it: a JSON Schema (chat `response_format`,
// Responses `text.format`, Anthropic `output_config.format`, vLLM's `structured_outputs.json`),
// any JSON object, or vLLM's regex, GBNF grammar and choice forms. output_constraint.h lowers it
// (with the tool calls `tool_choice` forces) to the one grammar the workers enforce.
struct ApiOutputFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema, kRegex, kGrammar, kChoice };
  Kind kind = Kind::kText;
  // The field it came by, for errors ("response_format", "text.format", ...).
  std::string param;
  std::string name;                  // json_schema's name, where the API has one
  nlohmann::ordered_json schema;     // kJsonSchema
  bool strict = false;               // OpenAI's json_schema.strict
  std::string text;                  // kRegex: the pattern; kGrammar: GBNF
  std::vector<std::string> choices;  // kChoice: the output is exactly one of them
};

struct ApiRequest {
  ApiKind kind = ApiKind::kChatCompletion;
  std::string model;
  // Chat: the conversation, and the functions the model may call.
  std::vector<ApiMessage> messages;
  std::vector<ApiTool> tools;
  ApiToolChoice tool_choice;
  bool parallel_tool_calls = true;
  // Completions: the prompt as text, or as token ids.
  std::string prompt_text;
  std::vector<TokenId> prompt_ids;
  bool prompt_is_ids = false;
  bool echo = false;
  bool stream = false;
  bool include_usage = false;
  // OpenAI chat and completions (vLLM's extension): each choice also carries the token ids it
  // generated (`token_ids`) and those of the prompt the worker ran (`prompt_token_ids`).
  bool return_token_ids = false;
  std::string user;
  ApiSampling sampling;
  ApiOutputFormat output_format;
  // The KV store keeps the prompt's blocks at least this long (Anthropic's cache_control ttl:
  // 300 for "5m", 3600 for "1h"; 0: the tenant's class alone decides).
  int64_t retention_floor_seconds = 0;
  // Echoed in the response where the API does (Anthropic and Responses `metadata`).
  nlohmann::json metadata;
  // Responses: its `instructions` (a system message for this response only, not carried to the
  // next one), the response it continues, and whether to keep it for GET and later
  // previous_response_id (`store`, default true). `messages` holds its own input items only; the
  // call puts the stored conversation before them.
  std::string instructions;
  std::string previous_response_id;
  bool store = true;
};

// What every API adapter checks a request against.
struct ApiLimits {
  std::string model;       // the id the router serves (GET /v1/models)
  int64_t vocab_size = 0;  // logit_bias ids and prompt ids must be below it
  int32_t max_n = 16;
  size_t max_messages = 4096;
  size_t max_logit_bias = 1024;
  int32_t max_top_logprobs = 20;
  int32_t max_completion_logprobs = 5;  // completions' `logprobs` (OpenAI's cap)
  size_t max_tools = 128;               // OpenAI's cap
  size_t max_tools_bytes = 256 << 10;   // the tool definitions' JSON
  // Images (image_part.h): at most max_images per request, each at most max_image_bytes decoded
  // (--max_images_per_request, --max_image_bytes), its header within `image` (dimensions, pixel
  // count); remote http(s) URLs only when the router fetches them (an ImageUrlFetcher).
  int64_t max_images = 16;
  int64_t max_image_bytes = int64_t{5} << 20;
  media::ImageLimits image;
  bool remote_images = false;
  // The body's JSON, bounded while it is parsed: depth, keys and array elements in all, one
  // string's bytes. The router derives them from --max_body_bytes and the model's context
  // (request_json.h RequestJsonLimits); the defaults are those of an 8 MiB body.
  JsonLimits json;
};

// A request the API refuses: the status (its code gives the HTTP status), the offending field
// and OpenAI's error code ("model_not_found", "context_length_exceeded"...), when there is one.
struct ApiError {
  absl::Status status;
  std::string param;
  std::string code;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_API_REQUEST_H_
