#include "router/api/request_json.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ferry {

using Json = nlohmann::ordered_json;

JsonLimits RequestJsonLimits(uint64_t max_body_bytes, int64_t context_tokens) {
  JsonLimits limits;
  limits.max_depth = kMaxRequestJsonDepth;
  limits.max_values = std::max<uint64_t>(
      max_body_bytes / 8,
      static_cast<uint64_t>(std::max<int64_t>(context_tokens, 0)) + kRequestJsonHeadroom);
  limits.max_string_bytes = max_body_bytes;
  return limits;
}

ApiError ParseRequestJson(absl::string_view body, const JsonLimits& limits, Json* out) {
  JsonParseError error;
  if (!ParseBoundedJson(body, limits, out, &error).ok()) {
    *out = Json();  // a partial document is not kept
    const std::string at = error.path.empty() ? "" : absl::StrCat(" (at '", error.path, "')");
    switch (error.kind) {
      case JsonParseError::Kind::kDepth:
        return ApiInvalid(
            "", absl::StrCat("the body nests JSON deeper than ", limits.max_depth, " levels", at));
      case JsonParseError::Kind::kValues:
        return ApiInvalid(error.path, absl::StrCat("the body has more than ", limits.max_values,
                                                   " JSON keys and array elements in all", at,
                                                   ": the router's limit for request bodies (from "
                                                   "--max_body_bytes and the model's context)"));
      case JsonParseError::Kind::kStringBytes:
        return ApiInvalid(error.path, absl::StrCat("the body has a JSON string longer than ",
                                                   limits.max_string_bytes, " bytes", at,
                                                   ": the router's limit for request bodies (from "
                                                   "--max_body_bytes)"));
      default:
        return ApiInvalid("", absl::StrCat("the body is not valid JSON: ", error.message));
    }
  }
  if (!out->is_object()) return ApiInvalid("", "the body must be a JSON object");
  return ApiOk();
}

const Json* JsonMember(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return false;
  }
  return true;
}

ApiError CheckFunctionSchema(const Json& schema, const std::string& param) {
  if (!schema.is_object()) {
    return ApiInvalid(param, "a function's 'parameters' must be a JSON schema object");
  }
  if (auto t = schema.find("type"); t != schema.end()) {
    bool ok = t->is_string();
    if (t->is_array()) {
      ok = !t->empty();
      for (const Json& x : *t) ok = ok && x.is_string();
    }
    if (!ok) return ApiInvalid(param + ".type", "'type' must be a string or a list of strings");
  }
  if (auto p = schema.find("properties"); p != schema.end()) {
    if (!p->is_object()) return ApiInvalid(param + ".properties", "'properties' must be an object");
    for (auto it = p->begin(); it != p->end(); ++it) {
      if (!it->is_object() && !it->is_boolean()) {
        return ApiInvalid(param + ".properties." + it.key(),
                          "each property must be a schema object");
      }
    }
  }
  if (auto r = schema.find("required"); r != schema.end()) {
    bool ok = r->is_array();
    if (ok) {
      for (const Json& x : *r) ok = ok && x.is_string();
    }
    if (!ok) return ApiInvalid(param + ".required", "'required' must be a list of strings");
  }
  return ApiOk();
}

ApiError ServedModel(const std::string& model, const ApiLimits& limits) {
  if (model == limits.model) return ApiOk();
  return ApiError{
      absl::NotFoundError(absl::StrCat(
          "The model '", model, "' does not exist; this server serves '", limits.model, "'")),
      "model", "model_not_found"};
}

ApiError ToolChoiceMode(const std::string& mode, ApiToolChoice* choice) {
  if (mode == "auto") {
    choice->mode = ApiToolChoice::Mode::kAuto;
  } else if (mode == "none") {
    choice->mode = ApiToolChoice::Mode::kNone;
  } else if (mode == "required") {
    choice->mode = ApiToolChoice::Mode::kRequired;
  } else {
    return ApiInvalid("tool_choice", absl::StrCat("'tool_choice' must be 'none', 'auto', "
                                                  "'required' or a function, not '",
                                                  mode, "'"));
  }
  return ApiOk();
}

ApiError CheckToolChoice(const ApiRequest& request) {
  const ApiToolChoice& c = request.tool_choice;
  if (c.mode == ApiToolChoice::Mode::kFunction) {
    bool known = false;
    for (const ApiTool& t : request.tools) known = known || t.name == c.function;
    if (!known) {
      return ApiInvalid("tool_choice", absl::StrCat("'tool_choice' names the function '",
                                                    c.function, "', which is not in 'tools'"));
    }
  }
  if (request.tools.empty() && c.mode != ApiToolChoice::Mode::kNone) {
    return ApiInvalid("tool_choice", "'tool_choice' is only allowed when 'tools' are specified");
  }
  return ApiOk();
}

const Json* RequestFields::Get(const char* key) {
  seen_.insert(key);
  return JsonMember(body_, key);
}

ApiError RequestFields::Number(const char* key, double lo, double hi, float* out) {
  const Json* v = Get(key);
  if (v == nullptr) return ApiOk();
  if (!v->is_number()) return ApiInvalid(key, absl::StrCat("'", key, "' must be a number"));
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi)) {
    return ApiInvalid(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], not ", d));
  }
  *out = static_cast<float>(d);
  return ApiOk();
}

ApiError RequestFields::Integer(const char* key, int64_t lo, int64_t hi, int64_t* out,
                                bool* present) {
  const Json* v = Get(key);
  *present = v != nullptr;
  if (v == nullptr) return ApiOk();
  if (!v->is_number_integer()) {
    return ApiInvalid(key, absl::StrCat("'", key, "' must be an integer"));
  }
  const int64_t i =
      v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX ? INT64_MAX : v->get<int64_t>();
  if (i < lo || i > hi) {
    return ApiInvalid(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], not ", i));
  }
  *out = i;
  return ApiOk();
}

ApiError RequestFields::Bool(const char* key, bool* out) {
  const Json* v = Get(key);
  if (v == nullptr) return ApiOk();
  if (!v->is_boolean()) return ApiInvalid(key, absl::StrCat("'", key, "' must be a boolean"));
  *out = v->get<bool>();
  return ApiOk();
}

ApiError RequestFields::String(const char* key, std::string* out) {
  const Json* v = Get(key);
  if (v == nullptr) return ApiOk();
  if (!v->is_string()) return ApiInvalid(key, absl::StrCat("'", key, "' must be a string"));
  *out = v->get<std::string>();
  return ApiOk();
}

ApiError RequestFields::Model(const ApiLimits& limits, std::string* model) {
  const nlohmann::ordered_json* m = Get("model");
  if (m == nullptr) return ApiInvalid("model", "'model' is required");
  if (!m->is_string()) return ApiInvalid("model", "'model' must be a string");
  *model = m->get<std::string>();
  return ServedModel(*model, limits);
}

ApiError RequestFields::TemperatureAndTopP(ApiSampling* sampling) {
  RETURN_IF_API_ERROR(Number("temperature", 0, 2, &sampling->temperature));
  RETURN_IF_API_ERROR(Number("top_p", 0, 1, &sampling->top_p));
  if (sampling->top_p == 0) return ApiInvalid("top_p", "'top_p' must be greater than 0");
  return ApiOk();
}

ApiError RequestFields::StreamOptions(bool stream, const nlohmann::ordered_json** options) {
  *options = Get("stream_options");
  if (*options == nullptr) return ApiOk();
  if (!(*options)->is_object()) {
    return ApiInvalid("stream_options", "'stream_options' must be an object");
  }
  if (!stream) {
    return ApiInvalid("stream_options", "'stream_options' is only allowed when 'stream' is true");
  }
  return ApiOk();
}

ApiError RequestFields::CheckRest(const std::set<std::string>& ignored,
                                  const std::set<std::string>& unsupported) const {
  for (auto it = body_.begin(); it != body_.end(); ++it) {
    const std::string& key = it.key();
    if (seen_.count(key) > 0 || ignored.count(key) > 0) continue;
    if (unsupported.count(key) > 0) {
      if (it->is_null()) continue;
      return ApiInvalid(key, absl::StrCat("'", key, "' is not supported by this server yet"),
                        "unsupported_parameter");
    }
    return ApiInvalid(key, absl::StrCat("Unrecognized request argument supplied: ", key),
                      "unrecognized_argument");
  }
  return ApiOk();
}

}  // namespace ferry
