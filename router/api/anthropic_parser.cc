#include "router/api/anthropic_parser.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/stop_strings.h"
#include "router/api/image_part.h"
#include "router/api/openai_writer.h"  // DumpJson
#include "router/api/output_format.h"
#include "router/api/request_json.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

// Anthropic's limits.
constexpr int kMaxCacheBreakpoints = 4;
constexpr int64_t kMinThinkingBudget = 1024;
constexpr int64_t kShortTtlSeconds = 300;  // "5m", the default
constexpr int64_t kLongTtlSeconds = 3600;  // "1h"

ApiError Ok() { return ApiError{absl::OkStatus(), "", ""}; }

// A refusal of the field at `param` (its path in the body); the message starts with the path, as
// Anthropic's do ("max_tokens: Field required").
ApiError Invalid(const std::string& param, const std::string& what, const std::string& code = "") {
  return ApiError{
      absl::InvalidArgumentError(param.empty() ? what : absl::StrCat(param, ": ", what)), param,
      code};
}

std::string Path(const std::string& param, const std::string& key) {
  return param.empty() ? key : absl::StrCat(param, ".", key);
}

std::string Index(const std::string& param, size_t i) { return absl::StrCat(param, "[", i, "]"); }

// A key's value; nullptr when it is absent or null (optional fields may be null).
const Json* Find(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// Every key of `object` is one of `allowed`.
ApiError CheckKeys(const Json& object, const std::string& param,
                   std::initializer_list<const char*> allowed) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool known = false;
    for (const char* key : allowed) known = known || it.key() == key;
    if (!known) return Invalid(Path(param, it.key()), "Extra inputs are not permitted");
  }
  return Ok();
}

// `v` as an int64 when it is a JSON integer (unsigned ones beyond INT64_MAX saturate).
bool AsInteger(const Json& v, int64_t* out) {
  if (!v.is_number_integer()) return false;
  *out = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
             ? INT64_MAX
             : v.get<int64_t>();
  return true;
}

// A required string field of `object` (at `param`).
ApiError RequiredString(const Json& object, const char* key, const std::string& param,
                        std::string* out) {
  const Json* v = Find(object, key);
  if (v == nullptr) return Invalid(Path(param, key), "Field required");
  if (!v->is_string()) return Invalid(Path(param, key), "must be a string");
  *out = v->get<std::string>();
  return Ok();
}

// An optional field of `object` that must have a JSON type when present (its value is ignored).
ApiError OptionalOfType(const Json& object, const char* key, const std::string& param,
                        Json::value_t type, const char* type_name) {
  const Json* v = Find(object, key);
  if (v == nullptr) return Ok();
  const bool ok = type == Json::value_t::boolean  ? v->is_boolean()
                  : type == Json::value_t::string ? v->is_string()
                  : type == Json::value_t::array  ? v->is_array()
                                                  : v->is_object();
  if (!ok) return Invalid(Path(param, key), absl::StrCat("must be ", type_name));
  return Ok();
}

// The body's top-level fields, read once each; what was not read is refused.
class Fields {
 public:
  explicit Fields(const Json& body) : body_(body) {}

  const Json* Get(const char* key) {
    seen_.insert(key);
    return Find(body_, key);
  }

  ApiError CheckRest() const {
    for (auto it = body_.begin(); it != body_.end(); ++it) {
      if (seen_.count(it.key()) == 0) return Invalid(it.key(), "Extra inputs are not permitted");
    }
    return Ok();
  }

 private:
  const Json& body_;
  std::set<std::string> seen_;
};

// The cache breakpoints of one request, in the order Anthropic processes them (tools, system,
// messages, then the top-level one).
struct CacheBreakpoints {
  int count = 0;
  int64_t longest_seconds = 0;
  bool saw_short = false;
};

// A cache_control value: {"type": "ephemeral", "ttl": "5m" | "1h"}.
ApiError ParseCacheControlValue(const Json& cc, const std::string& param, CacheBreakpoints* cache) {
  if (!cc.is_object()) {
    return Invalid(param, "must be an object such as {\"type\": \"ephemeral\"}");
  }
  RETURN_IF_API_ERROR(CheckKeys(cc, param, {"type", "ttl"}));
  const Json* type = Find(cc, "type");
  if (type == nullptr) return Invalid(Path(param, "type"), "Field required");
  if (*type != "ephemeral") return Invalid(Path(param, "type"), "must be 'ephemeral'");
  int64_t seconds = kShortTtlSeconds;
  if (const Json* ttl = Find(cc, "ttl"); ttl != nullptr) {
    if (*ttl == "1h") {
      seconds = kLongTtlSeconds;
    } else if (*ttl != "5m") {
      return Invalid(Path(param, "ttl"), "must be '5m' or '1h'");
    }
  }
  if (seconds == kLongTtlSeconds && cache->saw_short) {
    return Invalid(param,
                   "a cache_control block with ttl '1h' must not come after one with ttl '5m' "
                   "(blocks are processed in the order tools, system, messages)");
  }
  cache->saw_short = cache->saw_short || seconds == kShortTtlSeconds;
  ++cache->count;
  cache->longest_seconds = std::max(cache->longest_seconds, seconds);
  return Ok();
}

// The cache_control of a block (tool, system block, content block), when it has one.
ApiError ParseCacheControl(const Json& block, const std::string& param, CacheBreakpoints* cache) {
  const Json* cc = Find(block, "cache_control");
  if (cc == nullptr) return Ok();
  return ParseCacheControlValue(*cc, Path(param, "cache_control"), cache);
}

// A content block's type.
ApiError BlockType(const Json& block, const std::string& param, std::string* type) {
  if (!block.is_object()) return Invalid(param, "each content block must be an object");
  return RequiredString(block, "type", param, type);
}

// Blocks of a type this server does not take (where `allowed` are the types it takes there).
ApiError UnsupportedBlock(const std::string& type, const std::string& param, const char* allowed) {
  if (type == "document") {
    return Invalid(param, "document blocks are not supported by this server",
                   "unsupported_content");
  }
  return Invalid(
      Path(param, "type"),
      absl::StrCat("content blocks of type '", type, "' are not supported here (", allowed, ")"),
      "unsupported_content");
}

// {"type": "text", "text", "cache_control"?, "citations"?}.
ApiError ParseTextBlock(const Json& block, const std::string& param, CacheBreakpoints* cache,
                        std::string* text) {
  RETURN_IF_API_ERROR(CheckKeys(block, param, {"type", "text", "cache_control", "citations"}));
  RETURN_IF_API_ERROR(RequiredString(block, "text", param, text));
  if (text->empty()) return Invalid(Path(param, "text"), "text content blocks must be non-empty");
  RETURN_IF_API_ERROR(OptionalOfType(block, "citations", param, Json::value_t::array, "an array"));
  return ParseCacheControl(block, param, cache);
}

// An image_part.h refusal in Anthropic's words (the path first).
ApiError Anthropic(ApiError e) {
  if (e.status.ok() || e.param.empty()) return e;
  e.status = absl::Status(e.status.code(), absl::StrCat(e.param, ": ", e.status.message()));
  return e;
}

// {"type": "image", "source": {"type": "base64", "media_type", "data"} | {"type": "url", "url"},
// "cache_control"?}.
ApiError ParseImageBlock(const Json& block, const std::string& param, const ApiLimits& limits,
                         CacheBreakpoints* cache, ApiImage* image) {
  RETURN_IF_API_ERROR(CheckKeys(block, param, {"type", "source", "cache_control"}));
  const std::string p = Path(param, "source");
  const Json* source = Find(block, "source");
  if (source == nullptr) return Invalid(p, "Field required");
  if (!source->is_object()) return Invalid(p, "must be an object");
  std::string type;
  RETURN_IF_API_ERROR(RequiredString(*source, "type", p, &type));
  if (type == "base64") {
    RETURN_IF_API_ERROR(CheckKeys(*source, p, {"type", "media_type", "data"}));
    std::string media_type, data;
    RETURN_IF_API_ERROR(RequiredString(*source, "media_type", p, &media_type));
    RETURN_IF_API_ERROR(RequiredString(*source, "data", p, &data));
    RETURN_IF_API_ERROR(Anthropic(ImageFromBase64(data, media_type, p, limits, image)));
  } else if (type == "url") {
    RETURN_IF_API_ERROR(CheckKeys(*source, p, {"type", "url"}));
    std::string url;
    RETURN_IF_API_ERROR(RequiredString(*source, "url", p, &url));
    const bool remote = absl::StartsWith(absl::AsciiStrToLower(url.substr(0, 8)), "http");
    if (!remote) {
      return Invalid(Path(p, "url"), "must be an http(s) URL (inline images are base64 sources)");
    }
    RETURN_IF_API_ERROR(Anthropic(ImageFromUrl(url, p, limits, image)));
  } else if (type == "file") {
    return Invalid(Path(p, "type"), "file sources (the Files API) are not supported by this server",
                   "unsupported_content");
  } else {
    return Invalid(Path(p, "type"), absl::StrCat("must be 'base64' or 'url', not '", type, "'"));
  }
  return ParseCacheControl(block, param, cache);
}

// System content: a string, or text blocks (a content part each).
ApiError ParseSystemContent(const Json& content, const std::string& param, CacheBreakpoints* cache,
                            ApiMessage* out) {
  out->role = ApiRole::kSystem;
  if (content.is_string()) {
    if (!content.get_ref<const std::string&>().empty()) {
      out->content.push_back({content.get<std::string>()});
    }
    return Ok();
  }
  if (!content.is_array()) return Invalid(param, "must be a string or an array of text blocks");
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string p = Index(param, j);
    std::string type;
    RETURN_IF_API_ERROR(BlockType(content[j], p, &type));
    if (type != "text") return UnsupportedBlock(type, p, "system content is text blocks");
    ApiContentPart part;
    RETURN_IF_API_ERROR(ParseTextBlock(content[j], p, cache, &part.text));
    out->content.push_back(std::move(part));
  }
  return Ok();
}

// An id as Anthropic allows it: ^[a-zA-Z0-9_-]+$, at most `max` long (0: no maximum).
bool ValidName(const std::string& name, size_t max) {
  if (name.empty() || (max > 0 && name.size() > max)) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

// {"type": "tool_use", "id", "name", "input", "cache_control"?, "caller"?, "toolset_name"?}.
ApiError ParseToolUse(const Json& block, const std::string& param, CacheBreakpoints* cache,
                      ApiToolCall* call) {
  RETURN_IF_API_ERROR(CheckKeys(
      block, param, {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}));
  RETURN_IF_API_ERROR(RequiredString(block, "id", param, &call->id));
  if (!ValidName(call->id, 0)) {
    return Invalid(Path(param, "id"), "String should match pattern '^[a-zA-Z0-9_-]+$'");
  }
  RETURN_IF_API_ERROR(RequiredString(block, "name", param, &call->name));
  if (call->name.empty()) return Invalid(Path(param, "name"), "must not be empty");
  const Json* input = Find(block, "input");
  if (input == nullptr) return Invalid(Path(param, "input"), "Field required");
  if (!input->is_object()) return Invalid(Path(param, "input"), "must be an object");
  call->arguments = DumpJson(*input);
  RETURN_IF_API_ERROR(OptionalOfType(block, "caller", param, Json::value_t::object, "an object"));
  RETURN_IF_API_ERROR(
      OptionalOfType(block, "toolset_name", param, Json::value_t::string, "a string"));
  return ParseCacheControl(block, param, cache);
}

// {"type": "tool_result", "tool_use_id", "content"?: string | text blocks, "is_error"?,
// "cache_control"?, "toolset_name"?} as a tool message.
ApiError ParseToolResult(const Json& block, const std::string& param, const ApiLimits& limits,
                         CacheBreakpoints* cache, ApiMessage* out) {
  RETURN_IF_API_ERROR(
      CheckKeys(block, param,
                {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"}));
  out->role = ApiRole::kTool;
  RETURN_IF_API_ERROR(RequiredString(block, "tool_use_id", param, &out->tool_call_id));
  if (!ValidName(out->tool_call_id, 0)) {
    return Invalid(Path(param, "tool_use_id"), "String should match pattern '^[a-zA-Z0-9_-]+$'");
  }
  if (const Json* content = Find(block, "content"); content != nullptr) {
    const std::string p = Path(param, "content");
    if (content->is_string()) {
      out->content.push_back({content->get<std::string>()});
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const std::string q = Index(p, k);
        std::string type;
        RETURN_IF_API_ERROR(BlockType((*content)[k], q, &type));
        ApiContentPart part;
        if (type == "image") {
          part.image.emplace();
          RETURN_IF_API_ERROR(ParseImageBlock((*content)[k], q, limits, cache, &*part.image));
        } else if (type == "text") {
          RETURN_IF_API_ERROR(ParseTextBlock((*content)[k], q, cache, &part.text));
        } else {
          return UnsupportedBlock(type, q,
                                  "a tool result's content is a string or text and image blocks");
        }
        out->content.push_back(std::move(part));
      }
    } else {
      return Invalid(p, "must be a string or an array of text blocks");
    }
  }
  if (out->content.empty()) out->content.push_back({""});
  RETURN_IF_API_ERROR(
      OptionalOfType(block, "is_error", param, Json::value_t::boolean, "a boolean"));
  RETURN_IF_API_ERROR(
      OptionalOfType(block, "toolset_name", param, Json::value_t::string, "a string"));
  return ParseCacheControl(block, param, cache);
}

// One message of `messages`, appended to `out` as one or more internal messages.
ApiError ParseMessage(const Json& m, const std::string& param, bool last, const ApiLimits& limits,
                      CacheBreakpoints* cache, std::vector<ApiMessage>* out) {
  if (!m.is_object())
    return Invalid(param, "each message must be an object with a role and content");
  RETURN_IF_API_ERROR(CheckKeys(m, param, {"role", "content"}));
  std::string role;
  RETURN_IF_API_ERROR(RequiredString(m, "role", param, &role));
  if (role != "user" && role != "assistant" && role != "system") {
    return Invalid(Path(param, "role"),
                   absl::StrCat("must be 'user', 'assistant' or 'system', not '", role, "'"));
  }
  const std::string content_param = Path(param, "content");
  const Json* content = Find(m, "content");
  if (content == nullptr) return Invalid(content_param, "Field required");
  const bool assistant = role == "assistant";
  const ApiError empty = Invalid(content_param,
                                 "all messages must have non-empty content except for the "
                                 "optional final assistant message");
  if (role == "system") {
    ApiMessage system;
    RETURN_IF_API_ERROR(ParseSystemContent(*content, content_param, cache, &system));
    if (system.content.empty()) return empty;
    out->push_back(std::move(system));
    return Ok();
  }
  ApiMessage message;
  message.role = assistant ? ApiRole::kAssistant : ApiRole::kUser;
  std::vector<ApiMessage> results;  // user: its tool results, before its text
  bool has_blocks = false;          // assistant: thinking counts as content
  if (content->is_string()) {
    if (!content->get_ref<const std::string&>().empty()) {
      message.content.push_back({content->get<std::string>()});
    }
  } else if (content->is_array()) {
    for (size_t j = 0; j < content->size(); ++j) {
      const Json& block = (*content)[j];
      const std::string p = Index(content_param, j);
      std::string type;
      RETURN_IF_API_ERROR(BlockType(block, p, &type));
      if (type == "text") {
        ApiContentPart part;
        RETURN_IF_API_ERROR(ParseTextBlock(block, p, cache, &part.text));
        message.content.push_back(std::move(part));
      } else if (type == "image" && !assistant) {
        ApiContentPart part;
        part.image.emplace();
        RETURN_IF_API_ERROR(ParseImageBlock(block, p, limits, cache, &*part.image));
        message.content.push_back(std::move(part));
      } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
        if (!assistant) {
          return Invalid(Path(p, "type"),
                         absl::StrCat(type, " blocks are only allowed in assistant messages"));
        }
        has_blocks = true;
        if (type == "tool_use") {
          ApiToolCall call;
          RETURN_IF_API_ERROR(ParseToolUse(block, p, cache, &call));
          message.tool_calls.push_back(std::move(call));
        } else if (type == "thinking") {
          RETURN_IF_API_ERROR(CheckKeys(block, p, {"type", "thinking", "signature"}));
          std::string thinking;
          RETURN_IF_API_ERROR(RequiredString(block, "thinking", p, &thinking));
          RETURN_IF_API_ERROR(
              OptionalOfType(block, "signature", p, Json::value_t::string, "a string"));
          message.reasoning += thinking;
        } else {  // redacted_thinking: Anthropic's encrypted reasoning, nothing a model here reads
          RETURN_IF_API_ERROR(CheckKeys(block, p, {"type", "data"}));
          std::string data;
          RETURN_IF_API_ERROR(RequiredString(block, "data", p, &data));
        }
      } else if (type == "tool_result") {
        if (assistant) {
          return Invalid(Path(p, "type"), "tool_result blocks are only allowed in user messages");
        }
        ApiMessage result;
        RETURN_IF_API_ERROR(ParseToolResult(block, p, limits, cache, &result));
        results.push_back(std::move(result));
      } else {
        return UnsupportedBlock(
            type, p,
            assistant ? "text, tool_use, thinking, redacted_thinking" : "text, image, tool_result");
      }
    }
  } else {
    return Invalid(content_param, "must be a string or an array of content blocks");
  }
  if (assistant) {
    if (message.content.empty() && message.tool_calls.empty() && message.reasoning.empty()) {
      if (!has_blocks && !last) return empty;
      if (!has_blocks) return Ok();  // an empty final assistant message continues nothing
    }
    out->push_back(std::move(message));
    return Ok();
  }
  if (results.empty() && message.content.empty()) return empty;
  for (ApiMessage& r : results) out->push_back(std::move(r));
  if (!message.content.empty()) out->push_back(std::move(message));
  return Ok();
}

ApiError ParseMessages(const Json* messages, const ApiLimits& limits, CacheBreakpoints* cache,
                       std::vector<ApiMessage>* out) {
  if (messages == nullptr) return Invalid("messages", "Field required");
  if (!messages->is_array()) return Invalid("messages", "must be an array of messages");
  if (messages->empty()) return Invalid("messages", "at least one message is required");
  if (messages->size() > limits.max_messages) {
    return Invalid("messages", absl::StrCat("has ", messages->size(), " messages; at most ",
                                            limits.max_messages));
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    RETURN_IF_API_ERROR(ParseMessage((*messages)[i], Index("messages", i),
                                     i + 1 == messages->size(), limits, cache, out));
  }
  return Ok();
}

// The parts of a JSON schema a template and a tool-call parser rely on: an object of "type"
// "object", "properties" an object of schemas, "required" an array of strings.
ApiError CheckInputSchema(const Json& schema, const std::string& param) {
  if (!schema.is_object()) return Invalid(param, "must be a JSON schema object");
  const Json* type = Find(schema, "type");
  if (type == nullptr) return Invalid(Path(param, "type"), "Field required");
  if (*type != "object") return Invalid(Path(param, "type"), "must be 'object'");
  if (const Json* p = Find(schema, "properties"); p != nullptr) {
    if (!p->is_object()) return Invalid(Path(param, "properties"), "must be an object");
    for (auto it = p->begin(); it != p->end(); ++it) {
      if (!it->is_object() && !it->is_boolean()) {
        return Invalid(Path(Path(param, "properties"), it.key()), "must be a schema object");
      }
    }
  }
  if (const Json* r = Find(schema, "required"); r != nullptr) {
    bool ok = r->is_array();
    if (ok) {
      for (const Json& x : *r) ok = ok && x.is_string();
    }
    if (!ok) return Invalid(Path(param, "required"), "must be an array of strings");
  }
  return Ok();
}

ApiError ParseTools(const Json* tools, const ApiLimits& limits, CacheBreakpoints* cache,
                    std::vector<ApiTool>* out) {
  if (tools == nullptr) return Ok();
  if (!tools->is_array()) return Invalid("tools", "must be an array");
  if (tools->size() > limits.max_tools) {
    return Invalid("tools",
                   absl::StrCat("has ", tools->size(), " tools; at most ", limits.max_tools));
  }
  if (DumpJson(*tools).size() > limits.max_tools_bytes) {
    return Invalid("tools", absl::StrCat("the tool definitions take more than ",
                                         limits.max_tools_bytes, " bytes"));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string param = Index("tools", i);
    if (!t.is_object()) return Invalid(param, "each tool must be an object");
    if (const Json* type = Find(t, "type"); type != nullptr && *type != "custom") {
      if (!type->is_string()) return Invalid(Path(param, "type"), "must be a string");
      return Invalid(Path(param, "type"),
                     absl::StrCat("tools of type '", type->get<std::string>(),
                                  "' (Anthropic's server and client tools) are not supported by "
                                  "this server; define a custom tool with a name and an "
                                  "input_schema"),
                     "unsupported_parameter");
    }
    RETURN_IF_API_ERROR(
        CheckKeys(t, param,
                  {"type", "name", "description", "input_schema", "cache_control", "strict",
                   "allowed_callers", "defer_loading", "eager_input_streaming", "input_examples"}));
    ApiTool tool;
    RETURN_IF_API_ERROR(RequiredString(t, "name", param, &tool.name));
    if (!ValidName(tool.name, 64)) {
      return Invalid(Path(param, "name"), "String should match pattern '^[a-zA-Z0-9_-]{1,64}$'");
    }
    if (!names.insert(tool.name).second) {
      return Invalid(Path(param, "name"),
                     absl::StrCat("Tool names must be unique ('", tool.name, "' is repeated)"));
    }
    if (const Json* d = Find(t, "description"); d != nullptr) {
      if (!d->is_string()) return Invalid(Path(param, "description"), "must be a string");
      tool.description = d->get<std::string>();
    }
    const Json* schema = Find(t, "input_schema");
    if (schema == nullptr) return Invalid(Path(param, "input_schema"), "Field required");
    RETURN_IF_API_ERROR(CheckInputSchema(*schema, Path(param, "input_schema")));
    tool.parameters = *schema;
    if (const Json* s = Find(t, "strict"); s != nullptr) {
      if (!s->is_boolean()) return Invalid(Path(param, "strict"), "must be a boolean");
      tool.strict = s->get<bool>();
    }
    // Accepted and ignored: who may call the tool, deferred loading (no tool search here),
    // streaming hints, examples.
    RETURN_IF_API_ERROR(
        OptionalOfType(t, "allowed_callers", param, Json::value_t::array, "an array"));
    RETURN_IF_API_ERROR(
        OptionalOfType(t, "defer_loading", param, Json::value_t::boolean, "a boolean"));
    RETURN_IF_API_ERROR(
        OptionalOfType(t, "eager_input_streaming", param, Json::value_t::boolean, "a boolean"));
    RETURN_IF_API_ERROR(
        OptionalOfType(t, "input_examples", param, Json::value_t::array, "an array"));
    RETURN_IF_API_ERROR(ParseCacheControl(t, param, cache));
    out->push_back(std::move(tool));
  }
  return Ok();
}

// {"type": "auto" | "any" | "tool" | "none", "name" (tool), "disable_parallel_tool_use"?}.
ApiError ParseToolChoice(const Json* choice, ApiRequest* r) {
  if (choice == nullptr) return Ok();
  const std::string param = "tool_choice";
  if (!choice->is_object()) {
    return Invalid(param, "must be an object such as {\"type\": \"auto\"}");
  }
  std::string type;
  RETURN_IF_API_ERROR(RequiredString(*choice, "type", param, &type));
  ApiToolChoice& c = r->tool_choice;
  if (type == "auto" || type == "any") {
    RETURN_IF_API_ERROR(CheckKeys(*choice, param, {"type", "disable_parallel_tool_use"}));
    c.mode = type == "auto" ? ApiToolChoice::Mode::kAuto : ApiToolChoice::Mode::kRequired;
  } else if (type == "tool") {
    RETURN_IF_API_ERROR(CheckKeys(*choice, param, {"type", "name", "disable_parallel_tool_use"}));
    c.mode = ApiToolChoice::Mode::kFunction;
    RETURN_IF_API_ERROR(RequiredString(*choice, "name", param, &c.function));
    bool known = false;
    for (const ApiTool& t : r->tools) known = known || t.name == c.function;
    if (!known && !r->tools.empty()) {
      return Invalid(Path(param, "name"),
                     absl::StrCat("names the tool '", c.function, "', which is not in tools"));
    }
  } else if (type == "none") {
    RETURN_IF_API_ERROR(CheckKeys(*choice, param, {"type"}));
    c.mode = ApiToolChoice::Mode::kNone;
  } else {
    return Invalid(Path(param, "type"),
                   absl::StrCat("must be 'auto', 'any', 'tool' or 'none', not '", type, "'"));
  }
  if (const Json* d = Find(*choice, "disable_parallel_tool_use"); d != nullptr) {
    if (!d->is_boolean()) {
      return Invalid(Path(param, "disable_parallel_tool_use"), "must be a boolean");
    }
    r->parallel_tool_calls = !d->get<bool>();
  }
  if (r->tools.empty() && c.mode != ApiToolChoice::Mode::kNone) {
    return Invalid(param, "tool_choice may only be specified while providing tools");
  }
  return Ok();
}

// {"type": "enabled", "budget_tokens", "display"?} | {"type": "disabled"} |
// {"type": "adaptive", "display"?} | {"type": "between_tools"}: checked, and without effect (the
// model reasons, or not, as its template has it).
ApiError ParseThinking(const Json* thinking, std::optional<int64_t> max_tokens) {
  if (thinking == nullptr) return Ok();
  const std::string param = "thinking";
  if (!thinking->is_object()) {
    return Invalid(param, "must be an object such as {\"type\": \"disabled\"}");
  }
  std::string type;
  RETURN_IF_API_ERROR(RequiredString(*thinking, "type", param, &type));
  if (type == "enabled") {
    RETURN_IF_API_ERROR(CheckKeys(*thinking, param, {"type", "budget_tokens", "display"}));
    const Json* budget = Find(*thinking, "budget_tokens");
    if (budget == nullptr) return Invalid(Path(param, "budget_tokens"), "Field required");
    int64_t b = 0;
    if (!AsInteger(*budget, &b)) return Invalid(Path(param, "budget_tokens"), "must be an integer");
    if (b < kMinThinkingBudget) {
      return Invalid(Path(param, "budget_tokens"),
                     absl::StrCat("must be at least ", kMinThinkingBudget, ", not ", b));
    }
    if (max_tokens.has_value() && b >= *max_tokens) {
      return Invalid(Path(param, "budget_tokens"),
                     absl::StrCat("must be less than max_tokens (", *max_tokens, "), not ", b));
    }
  } else if (type == "adaptive") {
    RETURN_IF_API_ERROR(CheckKeys(*thinking, param, {"type", "display"}));
  } else if (type == "disabled" || type == "between_tools") {
    RETURN_IF_API_ERROR(CheckKeys(*thinking, param, {"type"}));
  } else {
    return Invalid(Path(param, "type"),
                   absl::StrCat("must be 'enabled', 'disabled' or 'adaptive', not '", type, "'"));
  }
  if (const Json* display = Find(*thinking, "display"); display != nullptr) {
    if (*display != "summarized" && *display != "omitted") {
      return Invalid(Path(param, "display"), "must be 'summarized' or 'omitted'");
    }
  }
  return Ok();
}

// {"effort"?, "format"?}: effort is accepted and ignored; a format is structured output
// (output_format.h).
ApiError ParseOutputConfig(const Json* config, ApiOutputFormat* format_out) {
  if (config == nullptr) return Ok();
  const std::string param = "output_config";
  if (!config->is_object()) return Invalid(param, "must be an object");
  RETURN_IF_API_ERROR(CheckKeys(*config, param, {"effort", "format"}));
  if (const Json* effort = Find(*config, "effort"); effort != nullptr) {
    if (*effort != "low" && *effort != "medium" && *effort != "high" && *effort != "xhigh" &&
        *effort != "max") {
      return Invalid(Path(param, "effort"), "must be 'low', 'medium', 'high', 'xhigh' or 'max'");
    }
  }
  if (const Json* format = Find(*config, "format"); format != nullptr) {
    RETURN_IF_API_ERROR(ParseAnthropicOutputFormat(*format, format_out));
  }
  return Ok();
}

ApiError Number(Fields& f, const char* key, double lo, double hi, bool open_lo, float* out) {
  const Json* v = f.Get(key);
  if (v == nullptr) return Ok();
  const char* range = open_lo ? "(" : "[";
  if (!v->is_number()) {
    return Invalid(key, absl::StrCat("must be a number in ", range, lo, ", ", hi, "]"));
  }
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi) || (open_lo && d == lo)) {
    return Invalid(key, absl::StrCat("must be a number in ", range, lo, ", ", hi, "], not ", d));
  }
  *out = static_cast<float>(d);
  return Ok();
}

// An optional top-level string that changes nothing.
ApiError IgnoredString(Fields& f, const char* key) {
  const Json* v = f.Get(key);
  if (v != nullptr && !v->is_string()) return Invalid(key, "must be a string");
  return Ok();
}

// The sampling fields, stream and metadata: /v1/messages only.
ApiError ParseGeneration(Fields& f, ApiRequest* r) {
  ApiSampling& s = r->sampling;
  if (const Json* stops = f.Get("stop_sequences"); stops != nullptr) {
    if (!stops->is_array()) return Invalid("stop_sequences", "must be an array of strings");
    for (size_t i = 0; i < stops->size(); ++i) {
      if (!(*stops)[i].is_string()) return Invalid(Index("stop_sequences", i), "must be a string");
      s.stop.push_back((*stops)[i].get<std::string>());
    }
    if (absl::Status st = StopStringMatcher::Validate(s.stop); !st.ok()) {
      return Invalid("stop_sequences", std::string(st.message()));
    }
  }
  RETURN_IF_API_ERROR(Number(f, "temperature", 0, 1, false, &s.temperature));
  RETURN_IF_API_ERROR(Number(f, "top_p", 0, 1, true, &s.top_p));
  if (const Json* k = f.Get("top_k"); k != nullptr) {
    int64_t v = 0;
    if (!AsInteger(*k, &v)) return Invalid("top_k", "must be an integer");
    if (v < 0 || v > (1 << 20)) {
      return Invalid("top_k", absl::StrCat("must be in [0, ", 1 << 20, "], not ", v));
    }
    s.top_k = static_cast<int32_t>(v);
  }
  if (const Json* stream = f.Get("stream"); stream != nullptr) {
    if (!stream->is_boolean()) return Invalid("stream", "must be a boolean");
    r->stream = stream->get<bool>();
  }
  if (const Json* metadata = f.Get("metadata"); metadata != nullptr) {
    if (!metadata->is_object()) return Invalid("metadata", "must be an object");
    if (const Json* user = Find(*metadata, "user_id"); user != nullptr) {
      if (!user->is_string()) return Invalid("metadata.user_id", "must be a string");
      r->user = user->get<std::string>();
    }
    r->metadata = nlohmann::json(*metadata);
  }
  if (const Json* tier = f.Get("service_tier"); tier != nullptr) {
    if (*tier != "auto" && *tier != "standard_only") {
      return Invalid("service_tier", "must be 'auto' or 'standard_only'");
    }
  }
  RETURN_IF_API_ERROR(IgnoredString(f, "inference_geo"));
  if (const Json* d = f.Get("diagnostics"); d != nullptr && !d->is_object()) {
    return Invalid("diagnostics", "must be an object");
  }
  if (f.Get("container") != nullptr) {
    return Invalid("container", "containers (code execution) are not supported by this server",
                   "unsupported_parameter");
  }
  return Ok();
}

ApiError Parse(absl::string_view body, const ApiLimits& limits, bool count_tokens, ApiRequest* r) {
  r->kind = ApiKind::kMessages;
  r->sampling.n = 1;
  Json json;
  RETURN_IF_API_ERROR(ParseRequestJson(body, limits.json, &json));
  Fields f(json);
  // The model, as the OpenAI adapter judges it.
  const Json* model = f.Get("model");
  if (model == nullptr) return Invalid("model", "Field required");
  if (!model->is_string()) return Invalid("model", "must be a string");
  r->model = model->get<std::string>();
  RETURN_IF_API_ERROR(ServedModel(r->model, limits));
  if (!count_tokens) {
    const Json* max_tokens = f.Get("max_tokens");
    if (max_tokens == nullptr) return Invalid("max_tokens", "Field required");
    int64_t v = 0;
    if (!AsInteger(*max_tokens, &v)) return Invalid("max_tokens", "must be an integer");
    if (v < 1 || v > INT32_MAX) {
      return Invalid("max_tokens", absl::StrCat("must be in [1, ", INT32_MAX, "], not ", v));
    }
    r->sampling.max_tokens = v;
  }
  // Anthropic's cache order: tools, system, messages, then the top-level breakpoint.
  CacheBreakpoints cache;
  RETURN_IF_API_ERROR(ParseTools(f.Get("tools"), limits, &cache, &r->tools));
  if (const Json* system = f.Get("system"); system != nullptr) {
    ApiMessage message;
    RETURN_IF_API_ERROR(ParseSystemContent(*system, "system", &cache, &message));
    if (!message.content.empty()) r->messages.push_back(std::move(message));
  }
  RETURN_IF_API_ERROR(ParseMessages(f.Get("messages"), limits, &cache, &r->messages));
  RETURN_IF_API_ERROR(Anthropic(CheckImages(*r, limits)));
  if (const Json* cc = f.Get("cache_control"); cc != nullptr) {
    RETURN_IF_API_ERROR(ParseCacheControlValue(*cc, "cache_control", &cache));
  }
  if (cache.count > kMaxCacheBreakpoints) {
    return Invalid("cache_control", absl::StrCat("A maximum of ", kMaxCacheBreakpoints,
                                                 " blocks with cache_control may be provided. "
                                                 "Found ",
                                                 cache.count, "."));
  }
  r->retention_floor_seconds = cache.longest_seconds;
  RETURN_IF_API_ERROR(ParseToolChoice(f.Get("tool_choice"), r));
  RETURN_IF_API_ERROR(ParseThinking(f.Get("thinking"), r->sampling.max_tokens));
  RETURN_IF_API_ERROR(ParseOutputConfig(f.Get("output_config"), &r->output_format));
  if (const Json* speed = f.Get("speed"); speed != nullptr) {
    if (*speed != "standard" && *speed != "fast") {
      return Invalid("speed", "must be 'standard' or 'fast'");
    }
  }
  if (!count_tokens) RETURN_IF_API_ERROR(ParseGeneration(f, r));
  return f.CheckRest();
}

}  // namespace

ApiError ParseAnthropicMessages(absl::string_view body, const ApiLimits& limits, ApiRequest* out) {
  return Parse(body, limits, /*count_tokens=*/false, out);
}

ApiError ParseAnthropicCountTokens(absl::string_view body, const ApiLimits& limits,
                                   ApiRequest* out) {
  return Parse(body, limits, /*count_tokens=*/true, out);
}

}  // namespace ferry
