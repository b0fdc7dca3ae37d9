// What the API adapters (openai_parser.h, anthropic_parser.h, responses_parser.h) share in reading
// a request's JSON body: parsing it in linear time within limits (bounded_json.h: depth, keys and
// array elements, string length, derived here from the body limit and the model's context),
// OpenAI's field conventions (null means absent; every top-level field read, ignored, or
// refused), and the checks of a function tool's name and JSON schema.
//
// Pure functions and a reader per request; thread-compatible.

#ifndef FERRY_ROUTER_API_REQUEST_JSON_H_
#define FERRY_ROUTER_API_REQUEST_JSON_H_

#include <cstdint>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "router/api/api_request.h"
#include "router/api/bounded_json.h"

namespace ferry {

#define RETURN_IF_API_ERROR(expr)   \
  do {                              \
    ApiError _e = (expr);           \
    if (!_e.status.ok()) return _e; \
  } while (0)

inline ApiError ApiOk() { return ApiError{absl::OkStatus(), "", ""}; }

// A 400 naming the field at `param` (its path in the body), with OpenAI's error `code` if any.
inline ApiError ApiInvalid(const std::string& param, const std::string& message,
                           const std::string& code = "") {
  return ApiError{absl::InvalidArgumentError(message), param, code};
}

// JSON nested deeper than this is refused as it is parsed: copying or dumping a value recurses
// over its levels, and a body of a few MiB could otherwise hold a million of them.
inline constexpr int kMaxRequestJsonDepth = 128;

// Keys and array elements a request may need besides a prompt of token ids: its messages (at
// most max_messages) and their parts, tool schemas (at most max_tools_bytes of JSON), stop
// strings, metadata.
inline constexpr uint64_t kRequestJsonHeadroom = uint64_t{1} << 16;

// The bounds of a request body's JSON for bodies of at most `max_body_bytes` (--max_body_bytes)
// to a model of `context_tokens` positions (0: not known yet):
//   - depth kMaxRequestJsonDepth;
//   - keys and array elements: max_body_bytes / 8 (the DOM of a body stays within a small
//     multiple of its bytes), or context_tokens + kRequestJsonHeadroom when that is more (a
//     completions prompt of a whole context of token ids, "1,1,1,...", is always legal);
//   - one string: max_body_bytes (a prompt may be one long string).
// At the default 8 MiB: 1,048,576 keys and elements (JsonLimits' defaults).
JsonLimits RequestJsonLimits(uint64_t max_body_bytes, int64_t context_tokens);

// `body` as a JSON object, or a 400 saying why not: not JSON, not an object, or over `limits`
// (the message names the limit, `param` where in the body it was met).
ApiError ParseRequestJson(absl::string_view body, const JsonLimits& limits,
                          nlohmann::ordered_json* out);

// Member `key` of `object`, or null when it is absent or JSON null (OpenAI's convention).
const nlohmann::ordered_json* JsonMember(const nlohmann::ordered_json& object, const char* key);

// A function name as OpenAI allows it: 1-64 of a-z, A-Z, 0-9, '_' and '-'.
bool ValidFunctionName(const std::string& name);

// The parts of a function's JSON schema a template and a reply parser rely on: an object, "type"
// a string (or strings), "properties" an object of schemas, "required" an array of strings.
ApiError CheckFunctionSchema(const nlohmann::ordered_json& schema, const std::string& param);

// A 404 model_not_found unless `model` is the id this router serves (limits.model).
ApiError ServedModel(const std::string& model, const ApiLimits& limits);

// tool_choice given as a string: "auto", "none" or "required" (else a 400 naming tool_choice).
ApiError ToolChoiceMode(const std::string& mode, ApiToolChoice* choice);

// After tools and tool_choice are read: a named function must be one of the tools, and a
// tool_choice other than "none" needs tools (400s naming tool_choice).
ApiError CheckToolChoice(const ApiRequest& request);

// Reads the top-level fields of one request body (which must outlive it), OpenAI's way: each
// read once by name, null meaning absent, a wrong type or range a 400 naming the field.
class RequestFields {
 public:
  explicit RequestFields(const nlohmann::ordered_json& body) : body_(body) {}

  const nlohmann::ordered_json* Get(const char* key);
  ApiError Number(const char* key, double lo, double hi, float* out);
  ApiError Integer(const char* key, int64_t lo, int64_t hi, int64_t* out, bool* present);
  ApiError Bool(const char* key, bool* out);
  ApiError String(const char* key, std::string* out);

  // Fields OpenAI's Chat Completions and Responses read alike. "model": required, a string, the
  // one this router serves (ServedModel).
  ApiError Model(const ApiLimits& limits, std::string* model);
  // "temperature" in [0, 2] and "top_p" in (0, 1].
  ApiError TemperatureAndTopP(ApiSampling* sampling);
  // "stream_options": absent (*options null), or an object allowed only when `stream`; the
  // caller checks its members.
  ApiError StreamOptions(bool stream, const nlohmann::ordered_json** options);

  // Every field was read or is `ignored` (changes nothing); one in `unsupported` (would change
  // the output and is not implemented) is refused by name (unsupported_parameter) unless null;
  // any other is OpenAI's "Unrecognized request argument supplied: x".
  ApiError CheckRest(const std::set<std::string>& ignored,
                     const std::set<std::string>& unsupported) const;

 private:
  const nlohmann::ordered_json& body_;
  std::set<std::string> seen_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_REQUEST_JSON_H_
