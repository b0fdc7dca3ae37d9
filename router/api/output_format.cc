#include "router/api/output_format.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

ApiError Bad(const std::string& param, const std::string& what) {
  return ApiInvalid(param, absl::StrCat("'", param, "': ", what));
}

// Every member of `object` is one of `allowed`.
ApiError Keys(const Json& object, const std::string& param,
              std::initializer_list<const char*> allowed) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool known = false;
    for (const char* key : allowed) known = known || it.key() == key;
    if (!known) {
      return Bad(
          absl::StrCat(param, ".", it.key()),
          absl::StrCat("unknown field (expected one of: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return ApiOk();
}

// A JSON Schema given as an object (or the booleans true/false, which JSON Schema allows).
ApiError Schema(const Json& schema, const std::string& param, ApiOutputFormat* out) {
  if (!schema.is_object() && !schema.is_boolean()) {
    return Bad(param, "a JSON Schema must be an object");
  }
  out->kind = ApiOutputFormat::Kind::kJsonSchema;
  out->schema = schema;
  return ApiOk();
}

ApiError OptionalString(const Json& object, const char* key, const std::string& param,
                        std::string* out) {
  const Json* v = JsonMember(object, key);
  if (v == nullptr) return ApiOk();
  if (!v->is_string()) return Bad(absl::StrCat(param, ".", key), "must be a string");
  *out = v->get<std::string>();
  return ApiOk();
}

ApiError OptionalBool(const Json& object, const char* key, const std::string& param, bool* out) {
  const Json* v = JsonMember(object, key);
  if (v == nullptr) return ApiOk();
  if (!v->is_boolean()) return Bad(absl::StrCat(param, ".", key), "must be a boolean");
  *out = v->get<bool>();
  return ApiOk();
}

ApiError SchemaName(const std::string& name, const std::string& param) {
  if (!ValidFunctionName(name)) {
    return Bad(param, "must be 1-64 characters of a-z, A-Z, 0-9, '_' and '-'");
  }
  return ApiOk();
}

// {"type": ...} of the OpenAI forms: the type, checked to be a string.
ApiError FormatType(const Json& format, const std::string& param, std::string* type) {
  if (!format.is_object()) return Bad(param, "must be an object with a 'type'");
  const Json* t = JsonMember(format, "type");
  if (t == nullptr || !t->is_string()) return Bad(param, "must be an object with a 'type'");
  *type = t->get<std::string>();
  return ApiOk();
}

// One of vLLM's forms, at `param`, into `out` (which holds no form yet).
ApiError VllmForm(const std::string& key, const Json& v, const std::string& param,
                  ApiOutputFormat* out) {
  if (key == "json") {
    if (v.is_string()) {
      Json parsed = Json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (parsed.is_discarded()) return Bad(param, "is not a JSON Schema (its text is not JSON)");
      return Schema(parsed, param, out);
    }
    return Schema(v, param, out);
  }
  if (key == "regex" || key == "grammar") {
    if (!v.is_string() || v.get<std::string>().empty()) {
      return Bad(param, "must be a non-empty string");
    }
    out->kind = key == "regex" ? ApiOutputFormat::Kind::kRegex : ApiOutputFormat::Kind::kGrammar;
    out->text = v.get<std::string>();
    return ApiOk();
  }
  if (key == "choice") {
    if (!v.is_array() || v.empty()) return Bad(param, "must be a non-empty array of strings");
    for (const Json& c : v) {
      if (!c.is_string()) return Bad(param, "must be a non-empty array of strings");
      out->choices.push_back(c.get<std::string>());
    }
    out->kind = ApiOutputFormat::Kind::kChoice;
    return ApiOk();
  }
  if (key == "json_object") {
    if (!v.is_boolean()) return Bad(param, "must be a boolean");
    if (v.get<bool>()) out->kind = ApiOutputFormat::Kind::kJsonObject;
    return ApiOk();
  }
  return ApiOk();
}

}  // namespace

ApiError ParseChatResponseFormat(const Json& format, ApiOutputFormat* out) {
  const std::string param = "response_format";
  std::string type;
  RETURN_IF_API_ERROR(FormatType(format, param, &type));
  out->param = param;
  if (type == "text") return Keys(format, param, {"type"});
  if (type == "json_object") {
    RETURN_IF_API_ERROR(Keys(format, param, {"type"}));
    out->kind = ApiOutputFormat::Kind::kJsonObject;
    return ApiOk();
  }
  if (type != "json_schema") {
    return Bad("response_format.type",
               absl::StrCat("unknown type '", type, "' (text, json_object, json_schema)"));
  }
  RETURN_IF_API_ERROR(Keys(format, param, {"type", "json_schema"}));
  const Json* js = JsonMember(format, "json_schema");
  const std::string jp = "response_format.json_schema";
  if (js == nullptr || !js->is_object()) return Bad(jp, "must be an object with a 'name'");
  RETURN_IF_API_ERROR(Keys(*js, jp, {"name", "schema", "strict", "description"}));
  const Json* name = JsonMember(*js, "name");
  if (name == nullptr || !name->is_string()) return Bad(jp + ".name", "is required (a string)");
  out->name = name->get<std::string>();
  RETURN_IF_API_ERROR(SchemaName(out->name, jp + ".name"));
  RETURN_IF_API_ERROR(OptionalBool(*js, "strict", jp, &out->strict));
  std::string description;
  RETURN_IF_API_ERROR(OptionalString(*js, "description", jp, &description));
  out->param = jp + ".schema";
  const Json* schema = JsonMember(*js, "schema");
  // No schema: OpenAI's default, any JSON object.
  if (schema == nullptr) {
    out->kind = ApiOutputFormat::Kind::kJsonObject;
    return ApiOk();
  }
  return Schema(*schema, out->param, out);
}

ApiError ParseResponsesTextFormat(const Json& format, ApiOutputFormat* out) {
  const std::string param = "text.format";
  std::string type;
  RETURN_IF_API_ERROR(FormatType(format, param, &type));
  out->param = param;
  if (type == "text") return Keys(format, param, {"type"});
  if (type == "json_object") {
    RETURN_IF_API_ERROR(Keys(format, param, {"type"}));
    out->kind = ApiOutputFormat::Kind::kJsonObject;
    return ApiOk();
  }
  if (type != "json_schema") {
    return Bad("text.format.type",
               absl::StrCat("unknown type '", type, "' (text, json_schema, json_object)"));
  }
  RETURN_IF_API_ERROR(Keys(format, param, {"type", "name", "schema", "strict", "description"}));
  const Json* name = JsonMember(format, "name");
  if (name == nullptr || !name->is_string()) return Bad(param + ".name", "is required (a string)");
  out->name = name->get<std::string>();
  RETURN_IF_API_ERROR(SchemaName(out->name, param + ".name"));
  RETURN_IF_API_ERROR(OptionalBool(format, "strict", param, &out->strict));
  std::string description;
  RETURN_IF_API_ERROR(OptionalString(format, "description", param, &description));
  const Json* schema = JsonMember(format, "schema");
  if (schema == nullptr) return Bad(param + ".schema", "is required");
  out->param = param + ".schema";
  return Schema(*schema, out->param, out);
}

ApiError ParseAnthropicOutputFormat(const Json& format, ApiOutputFormat* out) {
  const std::string param = "output_config.format";
  std::string type;
  RETURN_IF_API_ERROR(FormatType(format, param, &type));
  if (type != "json_schema") {
    return Bad(param + ".type", absl::StrCat("unknown type '", type, "' (json_schema)"));
  }
  RETURN_IF_API_ERROR(Keys(format, param, {"type", "schema"}));
  const Json* schema = JsonMember(format, "schema");
  if (schema == nullptr) return Bad(param + ".schema", "is required");
  out->param = param + ".schema";
  return Schema(*schema, out->param, out);
}

ApiError ParseVllmStructuredOutputs(RequestFields& fields, ApiOutputFormat* out) {
  const bool had = out->kind != ApiOutputFormat::Kind::kText;
  const std::string had_param = out->param;
  ApiOutputFormat found;
  int forms = 0;
  std::string first;
  auto take = [&](const std::string& key, const Json& v, const std::string& param) -> ApiError {
    ApiOutputFormat f;
    f.param = param;
    RETURN_IF_API_ERROR(VllmForm(key, v, param, &f));
    if (f.kind == ApiOutputFormat::Kind::kText) return ApiOk();  // json_object: false
    if (++forms > 1) {
      return Bad(param, absl::StrCat("only one structured output form may be given; '", first,
                                     "' is one already"));
    }
    first = param;
    found = std::move(f);
    return ApiOk();
  };
  if (const Json* so = fields.Get("structured_outputs"); so != nullptr) {
    if (!so->is_object()) return Bad("structured_outputs", "must be an object");
    for (auto it = so->begin(); it != so->end(); ++it) {
      const std::string param = absl::StrCat("structured_outputs.", it.key());
      if (it->is_null()) continue;
      if (it.key() != "json" && it.key() != "regex" && it.key() != "choice" &&
          it.key() != "grammar" && it.key() != "json_object") {
        return ApiInvalid(param,
                          absl::StrCat("'", param,
                                       "' is not supported by this server (json, regex, choice, "
                                       "grammar, json_object are)"),
                          "unsupported_parameter");
      }
      RETURN_IF_API_ERROR(take(it.key(), *it, param));
    }
  }
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (const Json* v = fields.Get(key); v != nullptr) {
      RETURN_IF_API_ERROR(take(std::string(key).substr(7), *v, key));
    }
  }
  for (const char* key : {"guided_decoding_backend", "guided_whitespace_pattern"}) {
    if (fields.Get(key) != nullptr) {
      return ApiInvalid(key, absl::StrCat("'", key, "' is not supported by this server"),
                        "unsupported_parameter");
    }
  }
  if (forms == 0) return ApiOk();
  if (had) {
    return Bad(first, absl::StrCat("only one structured output form may be given; '", had_param,
                                   "' is one already"));
  }
  *out = std::move(found);
  return ApiOk();
}

}  // namespace ferry
