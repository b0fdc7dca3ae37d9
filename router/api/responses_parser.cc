#include "router/api/responses_parser.h"

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "router/api/image_part.h"
#include "router/api/output_format.h"
#include "router/api/request_json.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

ApiError NotSupported(const std::string& param, const std::string& message) {
  return ApiInvalid(param, message, "unsupported_parameter");
}

// OpenAI's limits on `metadata`.
constexpr size_t kMaxMetadataPairs = 16;
constexpr size_t kMaxMetadataKeyChars = 64;
constexpr size_t kMaxMetadataValueChars = 512;

// Top-level fields that do not change the output: accepted and ignored (their type is not
// checked either: nothing reads them).
const std::set<std::string>& Ignored() {
  static const auto* fields =
      new std::set<std::string>{"prompt_cache_key", "prompt_cache_retention",
                                "prompt_cache_options", "service_tier", "safety_identifier"};
  return *fields;
}

// Top-level fields of server-side features this server does not have: refused by name unless null.
const std::set<std::string>& Unsupported() {
  static const auto* fields = new std::set<std::string>{
      "conversation", "prompt",          "context_management", "moderation",
      "image",        "access_programs", "background_options"};
  return *fields;
}

// `include` values that concern items this server never produces: accepted, ignored
// (message.output_text.logprobs, which it would have to write, is refused apart).
const std::set<std::string>& KnownIncludes() {
  static const auto* values = new std::set<std::string>{"file_search_call.results",
                                                        "web_search_call.results",
                                                        "web_search_call.action.sources",
                                                        "message.input_image.image_url",
                                                        "computer_call_output.output.image_url",
                                                        "code_interpreter_call.outputs",
                                                        "reasoning.encrypted_content"};
  return *values;
}

// Characters of UTF-8 text (bytes that start a character).
size_t Utf8Chars(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// A string member that must be there: "" and an error naming `param` otherwise.
ApiError RequiredString(const Json& object, const char* key, const std::string& param,
                        std::string* out) {
  const Json* v = JsonMember(object, key);
  if (v == nullptr) return ApiInvalid(param, absl::StrCat("'", key, "' is required"));
  if (!v->is_string()) return ApiInvalid(param, absl::StrCat("'", key, "' must be a string"));
  *out = v->get<std::string>();
  return ApiOk();
}

// Every key of `object` is one of `allowed`.
ApiError CheckKeys(const Json& object, const std::set<std::string>& allowed,
                   const std::string& param, const char* what) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (allowed.count(it.key()) == 0) {
      return ApiInvalid(param + "." + it.key(),
                        absl::StrCat("Unrecognized ", what, " argument supplied: ", it.key()));
    }
  }
  return ApiOk();
}

// A content part a model cannot see.
ApiError MediaRefused(const std::string& param, const std::string& type) {
  return ApiInvalid(param,
                    absl::StrCat("content parts of type '", type,
                                 "' are not supported by this server (no file or audio "
                                 "encoder): send text or input_image"),
                    "unsupported_content");
}

// {"type": "input_image", "image_url": a data: or http(s) URL, "detail"?}; a file_id is refused.
ApiError ParseInputImage(const Json& part, const std::string& p, const ApiLimits& limits,
                         ApiImage* image) {
  static const auto* keys = new std::set<std::string>{"type", "image_url", "file_id", "detail"};
  RETURN_IF_API_ERROR(CheckKeys(part, *keys, p, "content part"));
  if (JsonMember(part, "file_id") != nullptr) {
    return ApiInvalid(p + ".file_id",
                      "'file_id' images are not supported by this server (it has no Files API): "
                      "send 'image_url', a base64 data: URL",
                      "unsupported_content");
  }
  if (const Json* detail = JsonMember(part, "detail"); detail != nullptr) {
    if (!detail->is_string() || (*detail != "auto" && *detail != "low" && *detail != "high")) {
      return ApiInvalid(p + ".detail", "'detail' must be 'auto', 'low' or 'high'");
    }
  }
  std::string url;
  RETURN_IF_API_ERROR(RequiredString(part, "image_url", p + ".image_url", &url));
  return ImageFromUrl(url, p + ".image_url", limits, image);
}

// A message's content, or a function call's output: a string, or parts (adjacent text joined);
// input_image parts where `limits` is given (user messages).
ApiError ContentParts(const Json& content, const std::string& param, const ApiLimits* limits,
                      std::vector<ApiContentPart>* parts) {
  if (content.is_string()) {
    parts->push_back({content.get<std::string>(), std::nullopt});
    return ApiOk();
  }
  std::string text;
  std::string* out = &text;
  bool has_text = false;
  if (!content.is_array()) return ApiInvalid(param, "content must be a string or a list of parts");
  for (size_t k = 0; k < content.size(); ++k) {
    const Json& part = content[k];
    const std::string p = absl::StrCat(param, "[", k, "]");
    if (!part.is_object()) return ApiInvalid(p, "each content part must be an object");
    std::string type;
    RETURN_IF_API_ERROR(RequiredString(part, "type", p + ".type", &type));
    if (type == "input_text" || type == "output_text") {
      static const auto* keys = new std::set<std::string>{"type", "text", "annotations", "logprobs",
                                                          "prompt_cache_breakpoint"};
      RETURN_IF_API_ERROR(CheckKeys(part, *keys, p, "content part"));
      std::string text;
      RETURN_IF_API_ERROR(RequiredString(part, "text", p + ".text", &text));
      *out += text;
      has_text = true;
    } else if (type == "refusal") {
      static const auto* keys = new std::set<std::string>{"type", "refusal"};
      RETURN_IF_API_ERROR(CheckKeys(part, *keys, p, "content part"));
      std::string text;
      RETURN_IF_API_ERROR(RequiredString(part, "refusal", p + ".refusal", &text));
      *out += text;
      has_text = true;
    } else if (type == "input_image") {
      if (limits == nullptr) {
        return ApiInvalid(p + ".type", "images are accepted in user messages only",
                          "unsupported_content");
      }
      ApiImage image;
      RETURN_IF_API_ERROR(ParseInputImage(part, p, *limits, &image));
      if (has_text) parts->push_back({std::move(*out), std::nullopt});
      out->clear();
      has_text = false;
      parts->push_back({"", std::move(image)});
    } else if (type == "input_file" || type == "input_audio") {
      return MediaRefused(p + ".type", type);
    } else {
      return ApiInvalid(p + ".type", absl::StrCat("unknown content part type '", type,
                                                  "' (input_text, input_image, output_text, "
                                                  "refusal)"));
    }
  }
  if (has_text || parts->empty()) parts->push_back({std::move(text), std::nullopt});
  return ApiOk();
}

// `caller`, `namespace` and `async` of function-call items: features of tools this server does not
// have, accepted when they say nothing.
ApiError CheckPlainCall(const Json& item, const std::string& param) {
  if (const Json* caller = JsonMember(item, "caller"); caller != nullptr) {
    if (!caller->is_object() || caller->value("type", Json()) != "direct") {
      return NotSupported(param + ".caller", "only direct function calls are supported");
    }
  }
  if (JsonMember(item, "namespace") != nullptr) {
    return NotSupported(param + ".namespace", "namespaced tools are not supported");
  }
  if (const Json* async = JsonMember(item, "async"); async != nullptr && *async != false) {
    return NotSupported(param + ".async", "asynchronous function calls are not supported");
  }
  return ApiOk();
}

// Converts input items into messages (the rules are in the header).
class InputItems {
 public:
  InputItems(const ApiLimits& limits, std::vector<ApiMessage>* out) : out_(out), limits_(limits) {}

  ApiError Add(const Json& item, const std::string& param) {
    if (!item.is_object()) return ApiInvalid(param, "each input item must be an object");
    std::string type;
    if (const Json* t = JsonMember(item, "type"); t != nullptr) {
      if (!t->is_string()) return ApiInvalid(param + ".type", "'type' must be a string");
      type = t->get<std::string>();
    } else if (item.contains("role")) {
      type = "message";
    } else {
      return ApiInvalid(param + ".type", "each input item needs a 'type' (or a 'role': a message)");
    }
    if (type == "message") return Message(item, param);
    if (type == "function_call") return FunctionCall(item, param);
    if (type == "function_call_output") return FunctionCallOutput(item, param);
    if (type == "reasoning") return Reasoning(item, param);
    if (type == "item_reference") {
      return NotSupported(param + ".type",
                          "input items of type 'item_reference' are not supported by this "
                          "server (it keeps no items): send the item itself, or continue a "
                          "response with previous_response_id");
    }
    return NotSupported(param + ".type",
                        absl::StrCat("input items of type '", type,
                                     "' are not supported by this server; it takes message, "
                                     "function_call, function_call_output and reasoning items"));
  }

  // Places reasoning that no assistant message followed.
  void Finish() { FlushReasoning(); }

 private:
  ApiError Message(const Json& item, const std::string& param) {
    static const auto* keys =
        new std::set<std::string>{"type", "role", "content", "id", "status", "phase"};
    RETURN_IF_API_ERROR(CheckKeys(item, *keys, param, "input item"));
    std::string role;
    RETURN_IF_API_ERROR(RequiredString(item, "role", param + ".role", &role));
    ApiMessage message;
    if (role == "system" || role == "developer") {
      message.role = ApiRole::kSystem;  // templates of open models know no developer role
    } else if (role == "user") {
      message.role = ApiRole::kUser;
    } else if (role == "assistant") {
      message.role = ApiRole::kAssistant;
    } else {
      return ApiInvalid(param + ".role", absl::StrCat("unknown role '", role,
                                                      "' (user, assistant, system, developer)"));
    }
    const Json* content = JsonMember(item, "content");
    if (content == nullptr) return ApiInvalid(param + ".content", "'content' is required");
    RETURN_IF_API_ERROR(ContentParts(*content, param + ".content",
                                     message.role == ApiRole::kUser ? &limits_ : nullptr,
                                     &message.content));
    if (message.role == ApiRole::kAssistant) {
      message.reasoning = std::move(pending_reasoning_);
      pending_reasoning_.clear();
    } else {
      FlushReasoning();
    }
    out_->push_back(std::move(message));
    return ApiOk();
  }

  ApiError FunctionCall(const Json& item, const std::string& param) {
    static const auto* keys = new std::set<std::string>{
        "type", "call_id", "name", "arguments", "id", "status", "caller", "namespace", "async"};
    RETURN_IF_API_ERROR(CheckKeys(item, *keys, param, "input item"));
    RETURN_IF_API_ERROR(CheckPlainCall(item, param));
    ApiToolCall call;
    RETURN_IF_API_ERROR(RequiredString(item, "call_id", param + ".call_id", &call.id));
    RETURN_IF_API_ERROR(RequiredString(item, "name", param + ".name", &call.name));
    RETURN_IF_API_ERROR(RequiredString(item, "arguments", param + ".arguments", &call.arguments));
    if (call.id.empty()) return ApiInvalid(param + ".call_id", "'call_id' must not be empty");
    if (call.name.empty()) return ApiInvalid(param + ".name", "'name' must not be empty");
    // Joins the assistant message just before (its text, or the calls before it).
    if (out_->empty() || out_->back().role != ApiRole::kAssistant) {
      ApiMessage message;
      message.role = ApiRole::kAssistant;
      out_->push_back(std::move(message));
    }
    ApiMessage& assistant = out_->back();
    AppendReasoning(&assistant, std::move(pending_reasoning_));
    pending_reasoning_.clear();
    assistant.tool_calls.push_back(std::move(call));
    return ApiOk();
  }

  ApiError FunctionCallOutput(const Json& item, const std::string& param) {
    static const auto* keys = new std::set<std::string>{"type",   "call_id", "output", "id",
                                                        "status", "caller",  "name",   "namespace"};
    RETURN_IF_API_ERROR(CheckKeys(item, *keys, param, "input item"));
    RETURN_IF_API_ERROR(CheckPlainCall(item, param));
    ApiMessage message;
    message.role = ApiRole::kTool;
    RETURN_IF_API_ERROR(RequiredString(item, "call_id", param + ".call_id", &message.tool_call_id));
    if (message.tool_call_id.empty()) {
      return ApiInvalid(param + ".call_id", "'call_id' must not be empty");
    }
    if (const Json* name = JsonMember(item, "name"); name != nullptr) {
      if (!name->is_string()) return ApiInvalid(param + ".name", "'name' must be a string");
      message.name = name->get<std::string>();
    }
    const Json* output = JsonMember(item, "output");
    if (output == nullptr) return ApiInvalid(param + ".output", "'output' is required");
    RETURN_IF_API_ERROR(ContentParts(*output, param + ".output", nullptr, &message.content));
    FlushReasoning();
    out_->push_back(std::move(message));
    return ApiOk();
  }

  ApiError Reasoning(const Json& item, const std::string& param) {
    static const auto* keys = new std::set<std::string>{"type",    "id",     "summary",
                                                        "content", "status", "encrypted_content"};
    RETURN_IF_API_ERROR(CheckKeys(item, *keys, param, "input item"));
    std::string summary, content;
    RETURN_IF_API_ERROR(Texts(item, "summary", "summary_text", param, &summary));
    RETURN_IF_API_ERROR(Texts(item, "content", "reasoning_text", param, &content));
    if (const Json* e = JsonMember(item, "encrypted_content"); e != nullptr && !e->is_string()) {
      return ApiInvalid(param + ".encrypted_content", "'encrypted_content' must be a string");
    }
    std::string text = content.empty() ? std::move(summary) : std::move(content);
    if (text.empty()) return ApiOk();
    if (!pending_reasoning_.empty()) pending_reasoning_ += "\n\n";
    pending_reasoning_ += text;
    return ApiOk();
  }

  // A reasoning item's `summary` or `content`: [{"type": part_type, "text"}], joined by blank
  // lines.
  static ApiError Texts(const Json& item, const char* key, const char* part_type,
                        const std::string& param, std::string* out) {
    const Json* list = JsonMember(item, key);
    if (list == nullptr) return ApiOk();
    const std::string p = absl::StrCat(param, ".", key);
    if (!list->is_array()) return ApiInvalid(p, absl::StrCat("'", key, "' must be an array"));
    static const auto* keys = new std::set<std::string>{"type", "text"};
    for (size_t k = 0; k < list->size(); ++k) {
      const Json& part = (*list)[k];
      const std::string pk = absl::StrCat(p, "[", k, "]");
      if (!part.is_object()) return ApiInvalid(pk, "each part must be an object");
      RETURN_IF_API_ERROR(CheckKeys(part, *keys, pk, "reasoning part"));
      if (part.value("type", Json()) != part_type) {
        return ApiInvalid(pk + ".type",
                          absl::StrCat("the part's 'type' must be '", part_type, "'"));
      }
      std::string text;
      RETURN_IF_API_ERROR(RequiredString(part, "text", pk + ".text", &text));
      if (!out->empty() && !text.empty()) *out += "\n\n";
      *out += text;
    }
    return ApiOk();
  }

  static void AppendReasoning(ApiMessage* message, std::string reasoning) {
    if (reasoning.empty()) return;
    if (!message->reasoning.empty()) message->reasoning += "\n\n";
    message->reasoning += reasoning;
  }

  // Reasoning no assistant message followed: the assistant message just before takes it, or one
  // of its own (the model reasoned and said nothing, e.g. cut off by max_output_tokens).
  void FlushReasoning() {
    if (pending_reasoning_.empty()) return;
    if (out_->empty() || out_->back().role != ApiRole::kAssistant) {
      ApiMessage message;
      message.role = ApiRole::kAssistant;
      out_->push_back(std::move(message));
    }
    AppendReasoning(&out_->back(), std::move(pending_reasoning_));
    pending_reasoning_.clear();
  }

  std::vector<ApiMessage>* out_;
  const ApiLimits& limits_;
  std::string pending_reasoning_;
};

ApiError ParseInput(const Json* input, const ApiLimits& limits, std::vector<ApiMessage>* out) {
  out->clear();
  if (input == nullptr) return ApiInvalid("input", "'input' is required");
  if (input->is_string()) {
    ApiMessage message;
    message.role = ApiRole::kUser;
    message.content.push_back({input->get<std::string>()});
    out->push_back(std::move(message));
    return ApiOk();
  }
  if (!input->is_array()) return ApiInvalid("input", "'input' must be a string or a list of items");
  if (input->empty()) return ApiInvalid("input", "'input' must not be empty");
  if (input->size() > limits.max_messages) {
    return ApiInvalid("input", absl::StrCat("'input' has ", input->size(), " items; at most ",
                                            limits.max_messages));
  }
  InputItems items(limits, out);
  for (size_t i = 0; i < input->size(); ++i) {
    RETURN_IF_API_ERROR(items.Add((*input)[i], absl::StrCat("input[", i, "]")));
  }
  items.Finish();
  return ApiOk();
}

// One function tool in the Responses' flat form: {"type": "function", "name", "description",
// "parameters", "strict"}.
ApiError ParseFunctionTool(const Json& t, const std::string& param, ApiTool* tool) {
  for (auto it = t.begin(); it != t.end(); ++it) {
    const std::string& key = it.key();
    const std::string p = param + "." + key;
    if (key == "type") continue;
    if (key == "name") {
      if (!it->is_string()) return ApiInvalid(p, "'name' must be a string");
      tool->name = it->get<std::string>();
    } else if (it->is_null()) {
      continue;
    } else if (key == "description") {
      if (!it->is_string()) return ApiInvalid(p, "'description' must be a string");
      tool->description = it->get<std::string>();
    } else if (key == "parameters") {
      RETURN_IF_API_ERROR(CheckFunctionSchema(*it, p));
      tool->parameters = *it;
    } else if (key == "strict") {
      if (!it->is_boolean()) return ApiInvalid(p, "'strict' must be a boolean");
      tool->strict = it->get<bool>();
    } else if (key == "defer_loading" || key == "async") {
      if (!it->is_boolean()) return ApiInvalid(p, absl::StrCat("'", key, "' must be a boolean"));
      if (it->get<bool>()) {
        return NotSupported(p, absl::StrCat("'", key, "' is not supported by this server"));
      }
    } else if (key == "allowed_callers" || key == "output_schema") {
      return NotSupported(p, absl::StrCat("'", key, "' is not supported by this server"));
    } else {
      return ApiInvalid(p, absl::StrCat("Unrecognized function argument supplied: ", key));
    }
  }
  if (!ValidFunctionName(tool->name)) {
    return ApiInvalid(param + ".name",
                      absl::StrCat("'", tool->name,
                                   "' is not a valid function name (1 to 64 of a-z, A-Z, 0-9, "
                                   "underscores and dashes)"));
  }
  return ApiOk();
}

ApiError ParseTools(RequestFields& f, const ApiLimits& limits, ApiRequest* r) {
  if (const Json* tools = f.Get("tools"); tools != nullptr) {
    if (!tools->is_array()) return ApiInvalid("tools", "'tools' must be an array");
    if (tools->size() > limits.max_tools) {
      return ApiInvalid("tools", absl::StrCat("'tools' has ", tools->size(), " entries; at most ",
                                              limits.max_tools));
    }
    if (tools->dump(-1, ' ', false, Json::error_handler_t::replace).size() >
        limits.max_tools_bytes) {
      return ApiInvalid("tools", absl::StrCat("the tool definitions take more than ",
                                              limits.max_tools_bytes, " bytes"));
    }
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string param = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return ApiInvalid(param, "each tool must be an object");
      std::string type;
      RETURN_IF_API_ERROR(RequiredString(t, "type", param + ".type", &type));
      if (type != "function") {
        return NotSupported(param + ".type",
                            absl::StrCat("tools of type '", type,
                                         "' are not supported by this server; it runs function "
                                         "tools only"));
      }
      ApiTool tool;
      RETURN_IF_API_ERROR(ParseFunctionTool(t, param, &tool));
      if (!names.insert(tool.name).second) {
        return ApiInvalid(param + ".name", absl::StrCat("two tools are named '", tool.name, "'"));
      }
      r->tools.push_back(std::move(tool));
    }
  }
  if (const Json* choice = f.Get("tool_choice"); choice != nullptr) {
    ApiToolChoice& c = r->tool_choice;
    if (choice->is_string()) {
      RETURN_IF_API_ERROR(ToolChoiceMode(choice->get<std::string>(), &c));
    } else if (choice->is_object()) {
      std::string type;
      RETURN_IF_API_ERROR(RequiredString(*choice, "type", "tool_choice.type", &type));
      if (type != "function") {
        return NotSupported("tool_choice.type",
                            absl::StrCat("a 'tool_choice' of type '", type,
                                         "' is not supported by this server; name a function: "
                                         "{\"type\": \"function\", \"name\": ...}"));
      }
      static const auto* keys = new std::set<std::string>{"type", "name"};
      RETURN_IF_API_ERROR(CheckKeys(*choice, *keys, "tool_choice", "tool_choice"));
      RETURN_IF_API_ERROR(RequiredString(*choice, "name", "tool_choice.name", &c.function));
      c.mode = ApiToolChoice::Mode::kFunction;
    } else {
      return ApiInvalid("tool_choice", "'tool_choice' must be a string or an object");
    }
    RETURN_IF_API_ERROR(CheckToolChoice(*r));
  }
  return f.Bool("parallel_tool_calls", &r->parallel_tool_calls);
}

ApiError ParseMetadata(const Json* metadata, ApiRequest* r) {
  if (metadata == nullptr) return ApiOk();
  if (!metadata->is_object()) return ApiInvalid("metadata", "'metadata' must be an object");
  if (metadata->size() > kMaxMetadataPairs) {
    return ApiInvalid("metadata", absl::StrCat("'metadata' has ", metadata->size(),
                                               " keys; at most ", kMaxMetadataPairs));
  }
  r->metadata = nlohmann::json::object();
  for (auto it = metadata->begin(); it != metadata->end(); ++it) {
    const std::string param = "metadata." + it.key();
    if (Utf8Chars(it.key()) > kMaxMetadataKeyChars) {
      return ApiInvalid("metadata", absl::StrCat("'metadata' keys are at most ",
                                                 kMaxMetadataKeyChars, " characters"));
    }
    if (!it->is_string()) return ApiInvalid(param, "'metadata' values must be strings");
    const std::string value = it->get<std::string>();
    if (Utf8Chars(value) > kMaxMetadataValueChars) {
      return ApiInvalid(param, absl::StrCat("'metadata' values are at most ",
                                            kMaxMetadataValueChars, " characters"));
    }
    r->metadata[it.key()] = value;
  }
  return ApiOk();
}

// `text`: {"format": a text or JSON format (output_format.h), "verbosity"}.
ApiError ParseText(const Json* text, ApiOutputFormat* format_out) {
  if (text == nullptr) return ApiOk();
  if (!text->is_object()) return ApiInvalid("text", "'text' must be an object");
  static const auto* keys = new std::set<std::string>{"format", "verbosity"};
  RETURN_IF_API_ERROR(CheckKeys(*text, *keys, "text", "text"));
  if (const Json* format = JsonMember(*text, "format"); format != nullptr) {
    RETURN_IF_API_ERROR(ParseResponsesTextFormat(*format, format_out));
  }
  if (const Json* verbosity = JsonMember(*text, "verbosity"); verbosity != nullptr) {
    if (*verbosity != "low" && *verbosity != "medium" && *verbosity != "high") {
      return ApiInvalid("text.verbosity", "'text.verbosity' must be 'low', 'medium' or 'high'");
    }
  }
  return ApiOk();
}

// `reasoning`: OpenAI's reasoning options, checked for their shape; open models reason as their
// template lets them, so none changes the output.
ApiError ParseReasoning(const Json* reasoning) {
  if (reasoning == nullptr) return ApiOk();
  if (!reasoning->is_object()) return ApiInvalid("reasoning", "'reasoning' must be an object");
  static const auto* keys =
      new std::set<std::string>{"effort", "summary", "generate_summary", "context", "mode"};
  RETURN_IF_API_ERROR(CheckKeys(*reasoning, *keys, "reasoning", "reasoning"));
  for (auto it = reasoning->begin(); it != reasoning->end(); ++it) {
    if (!it->is_null() && !it->is_string()) {
      return ApiInvalid("reasoning." + it.key(),
                        absl::StrCat("'reasoning.", it.key(), "' must be a string"));
    }
  }
  return ApiOk();
}

ApiError ParseInclude(const Json* include) {
  if (include == nullptr) return ApiOk();
  if (!include->is_array()) return ApiInvalid("include", "'include' must be a list of strings");
  for (const Json& v : *include) {
    if (!v.is_string()) return ApiInvalid("include", "'include' must be a list of strings");
    const std::string value = v.get<std::string>();
    if (value == "message.output_text.logprobs") {
      return NotSupported("include",
                          "'include' of 'message.output_text.logprobs' is not supported by this "
                          "server's Responses API yet (Chat Completions has logprobs)");
    }
    if (KnownIncludes().count(value) == 0) {
      return ApiInvalid("include", absl::StrCat("unknown 'include' value '", value, "'"));
    }
  }
  return ApiOk();
}

}  // namespace

ApiError ParseResponses(absl::string_view body, const ApiLimits& limits, ApiRequest* r) {
  Json json;
  RETURN_IF_API_ERROR(ParseRequestJson(body, limits.json, &json));
  RequestFields f(json);
  r->kind = ApiKind::kResponses;
  r->sampling.n = 1;

  RETURN_IF_API_ERROR(f.Model(limits, &r->model));

  RETURN_IF_API_ERROR(ParseInput(f.Get("input"), limits, &r->messages));
  RETURN_IF_API_ERROR(CheckImages(*r, limits));
  RETURN_IF_API_ERROR(f.String("instructions", &r->instructions));
  RETURN_IF_API_ERROR(f.String("previous_response_id", &r->previous_response_id));
  if (f.Get("previous_response_id") != nullptr &&
      !absl::StartsWith(r->previous_response_id, "resp")) {
    return ApiInvalid("previous_response_id",
                      absl::StrCat("Invalid 'previous_response_id': '", r->previous_response_id,
                                   "'. Expected an ID that begins with 'resp'."));
  }
  RETURN_IF_API_ERROR(f.Bool("store", &r->store));
  RETURN_IF_API_ERROR(ParseMetadata(f.Get("metadata"), r));
  RETURN_IF_API_ERROR(f.String("user", &r->user));

  ApiSampling& s = r->sampling;
  int64_t v = 0;
  bool present = false;
  RETURN_IF_API_ERROR(f.Integer("max_output_tokens", 1, INT32_MAX, &v, &present));
  if (present) s.max_tokens = v;
  RETURN_IF_API_ERROR(f.TemperatureAndTopP(&s));
  RETURN_IF_API_ERROR(f.Integer("top_logprobs", 0, limits.max_top_logprobs, &v, &present));
  if (present && v > 0) {
    return NotSupported("top_logprobs",
                        "'top_logprobs' is not supported by this server's Responses API yet "
                        "(Chat Completions has logprobs)");
  }
  RETURN_IF_API_ERROR(f.Integer("max_tool_calls", 0, INT64_MAX, &v, &present));

  RETURN_IF_API_ERROR(f.Bool("stream", &r->stream));
  const Json* so = nullptr;
  RETURN_IF_API_ERROR(f.StreamOptions(r->stream, &so));
  if (so != nullptr) {
    static const auto* keys = new std::set<std::string>{"include_obfuscation"};
    RETURN_IF_API_ERROR(CheckKeys(*so, *keys, "stream_options", "stream option"));
    if (const Json* o = JsonMember(*so, "include_obfuscation"); o != nullptr && !o->is_boolean()) {
      return ApiInvalid("stream_options.include_obfuscation",
                        "'stream_options.include_obfuscation' must be a boolean");
    }
  }

  RETURN_IF_API_ERROR(ParseTools(f, limits, r));
  RETURN_IF_API_ERROR(ParseReasoning(f.Get("reasoning")));
  RETURN_IF_API_ERROR(ParseText(f.Get("text"), &r->output_format));
  if (const Json* truncation = f.Get("truncation"); truncation != nullptr) {
    if (*truncation == "auto") {
      return NotSupported("truncation",
                          "'truncation' 'auto' is not supported by this server: a conversation "
                          "longer than the context is refused, not cut");
    }
    if (*truncation != "disabled") {
      return ApiInvalid("truncation", "'truncation' must be 'disabled' or 'auto'");
    }
  }
  RETURN_IF_API_ERROR(ParseInclude(f.Get("include")));
  bool background = false;
  RETURN_IF_API_ERROR(f.Bool("background", &background));
  if (background) {
    return NotSupported("background",
                        "'background' responses are not supported by this server: send the "
                        "request and wait, or stream");
  }
  return f.CheckRest(Ignored(), Unsupported());
}

}  // namespace ferry
