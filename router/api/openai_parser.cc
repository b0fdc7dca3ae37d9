#include "router/api/openai_parser.h"

#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/stop_strings.h"
#include "router/api/image_part.h"
#include "router/api/output_format.h"
#include "router/api/request_json.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

// Fields that would change the output and are not implemented: refused by name.
const std::set<std::string>& Unsupported() {
  static const auto* fields =
      new std::set<std::string>{"functions", "function_call",      "audio",           "prediction",
                                "suffix",    "web_search_options", "reasoning_effort"};
  return *fields;
}

// Fields that do not change the output: accepted and ignored.
const std::set<std::string>& Ignored() {
  static const auto* fields = new std::set<std::string>{"metadata", "store", "service_tier"};
  return *fields;
}

// What chat and completions share: model, sampling, streaming, user.
ApiError ParseCommon(RequestFields& f, const ApiLimits& limits, ApiRequest* r) {
  RETURN_IF_API_ERROR(f.Model(limits, &r->model));
  ApiSampling& s = r->sampling;
  RETURN_IF_API_ERROR(f.TemperatureAndTopP(&s));
  RETURN_IF_API_ERROR(f.Number("frequency_penalty", -2, 2, &s.frequency_penalty));
  RETURN_IF_API_ERROR(f.Number("presence_penalty", -2, 2, &s.presence_penalty));
  RETURN_IF_API_ERROR(f.Number("min_p", 0, 1, &s.min_p));
  RETURN_IF_API_ERROR(f.Number("repetition_penalty", 0, 2, &s.repetition_penalty));
  if (s.repetition_penalty == 0) {
    return ApiInvalid("repetition_penalty", "'repetition_penalty' must be greater than 0");
  }
  int64_t v = 0;
  bool present = false;
  RETURN_IF_API_ERROR(f.Integer("top_k", -1, 1 << 20, &v, &present));
  if (present) s.top_k = v < 0 ? 0 : static_cast<int32_t>(v);  // -1: off, as vLLM spells it
  RETURN_IF_API_ERROR(f.Integer("n", 1, limits.max_n, &v, &present));
  if (present) s.n = static_cast<int32_t>(v);
  RETURN_IF_API_ERROR(f.Integer("seed", INT64_MIN, INT64_MAX, &v, &present));
  if (present) s.seed = static_cast<uint64_t>(v);
  RETURN_IF_API_ERROR(f.Integer("min_tokens", 0, INT32_MAX, &v, &present));
  if (present) s.min_tokens = v;
  RETURN_IF_API_ERROR(f.Bool("ignore_eos", &s.ignore_eos));
  RETURN_IF_API_ERROR(f.Bool("return_token_ids", &r->return_token_ids));
  RETURN_IF_API_ERROR(f.Bool("stream", &r->stream));
  const Json* so = nullptr;
  RETURN_IF_API_ERROR(f.StreamOptions(r->stream, &so));
  if (so != nullptr) {
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it.key() != "include_usage") {
        return ApiInvalid("stream_options", absl::StrCat("Unrecognized stream option: ", it.key()));
      }
      if (!it->is_boolean()) {
        return ApiInvalid("stream_options", "'stream_options.include_usage' must be a boolean");
      }
      r->include_usage = it->get<bool>();
    }
  }
  RETURN_IF_API_ERROR(f.String("user", &r->user));
  // stop: a string or a list of strings.
  if (const Json* stop = f.Get("stop"); stop != nullptr) {
    if (stop->is_string()) {
      s.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const Json& item : *stop) {
        if (!item.is_string()) return ApiInvalid("stop", "'stop' must be a string or strings");
        s.stop.push_back(item.get<std::string>());
      }
    } else {
      return ApiInvalid("stop", "'stop' must be a string or a list of strings");
    }
    if (absl::Status st = StopStringMatcher::Validate(s.stop); !st.ok()) {
      return ApiInvalid("stop", std::string(st.message()));
    }
  }
  // logit_bias: {"token id": bias}.
  if (const Json* bias = f.Get("logit_bias"); bias != nullptr) {
    if (!bias->is_object()) return ApiInvalid("logit_bias", "'logit_bias' must be an object");
    if (bias->size() > limits.max_logit_bias) {
      return ApiInvalid("logit_bias", absl::StrCat("'logit_bias' has ", bias->size(),
                                                   " entries; at most ", limits.max_logit_bias));
    }
    for (auto it = bias->begin(); it != bias->end(); ++it) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(it.key(), &id) || id < 0 || id >= limits.vocab_size) {
        return ApiInvalid("logit_bias", absl::StrCat("'logit_bias': '", it.key(),
                                                     "' is not a token id of the vocabulary (0 to ",
                                                     limits.vocab_size - 1, ")"));
      }
      if (!it->is_number() || !(it->get<double>() >= -100 && it->get<double>() <= 100)) {
        return ApiInvalid("logit_bias", absl::StrCat("'logit_bias': the bias of token ", id,
                                                     " must be a number in [-100, 100]"));
      }
      s.logit_bias.emplace_back(static_cast<TokenId>(id), it->get<float>());
    }
  }
  return ApiOk();
}

// A message's content: a string, or parts (adjacent text parts joined); image_url parts
// (image_part.h) only in user messages.
ApiError ParseContent(const Json& content, size_t index, bool images, const ApiLimits& limits,
                      std::vector<ApiContentPart>* out) {
  const std::string param = absl::StrCat("messages[", index, "].content");
  if (content.is_string()) {
    out->push_back({content.get<std::string>(), std::nullopt});
    return ApiOk();
  }
  if (!content.is_array()) return ApiInvalid(param, "content must be a string or a list of parts");
  std::string text;
  bool has_text = false;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return ApiInvalid(param, "each content part must be an object with a 'type'");
    }
    const std::string type = part["type"].get<std::string>();
    if (type == "text") {
      if (!part.contains("text") || !part["text"].is_string()) {
        return ApiInvalid(param, "a text part needs 'text', a string");
      }
      text += part["text"].get<std::string>();
      has_text = true;
    } else if (type == "image_url") {
      const std::string p = absl::StrCat(param, "[", j, "].image_url");
      if (!images) {
        return ApiInvalid(p, "images are accepted in user messages only", "unsupported_content");
      }
      // {"url": ..., "detail": ...} (detail accepted and ignored: the model's processor decides
      // the resolution), or the URL as a string (the older form).
      const Json* url = nullptr;
      if (part.contains("image_url") && part["image_url"].is_string()) {
        url = &part["image_url"];
      } else if (part.contains("image_url") && part["image_url"].is_object()) {
        const Json& o = part["image_url"];
        for (auto it = o.begin(); it != o.end(); ++it) {
          if (it.key() == "url") {
            url = &*it;
          } else if (it.key() == "detail") {
            if (!it->is_null() &&
                (!it->is_string() || (*it != "auto" && *it != "low" && *it != "high"))) {
              return ApiInvalid(p + ".detail", "'detail' must be 'auto', 'low' or 'high'");
            }
          } else {
            return ApiInvalid(p + "." + it.key(),
                              absl::StrCat("Unrecognized image_url argument supplied: ", it.key()));
          }
        }
      }
      if (url == nullptr || !url->is_string()) {
        return ApiInvalid(p, "an image_url part needs 'image_url': {\"url\": a string}");
      }
      ApiImage image;
      RETURN_IF_API_ERROR(ImageFromUrl(url->get<std::string>(), p, limits, &image));
      if (has_text) out->push_back({std::move(text), std::nullopt});
      text.clear();
      has_text = false;
      out->push_back({"", std::move(image)});
    } else if (type == "input_audio" || type == "file") {
      return ApiInvalid(
          param,
          absl::StrCat("content parts of type '", type, "' are not supported by this server yet"),
          "unsupported_content");
    } else {
      return ApiInvalid(param, absl::StrCat("unknown content part type '", type, "'"));
    }
  }
  if (has_text || out->empty()) out->push_back({std::move(text), std::nullopt});
  return ApiOk();
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments"}}].
ApiError ParseToolCalls(const Json& calls, const std::string& param,
                        std::vector<ApiToolCall>* out) {
  if (!calls.is_array()) return ApiInvalid(param, "'tool_calls' must be an array");
  for (size_t k = 0; k < calls.size(); ++k) {
    const Json& c = calls[k];
    const std::string p = absl::StrCat(param, "[", k, "]");
    if (!c.is_object()) return ApiInvalid(p, "each tool call must be an object");
    ApiToolCall call;
    for (auto it = c.begin(); it != c.end(); ++it) {
      if (it.key() == "id") {
        if (!it->is_string()) return ApiInvalid(p + ".id", "'id' must be a string");
        call.id = it->get<std::string>();
      } else if (it.key() == "type") {
        if (*it != "function") return ApiInvalid(p + ".type", "'type' must be 'function'");
      } else if (it.key() == "function") {
        const Json& f = *it;
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) {
          return ApiInvalid(p + ".function",
                            "'function' must be an object with a 'name', a string");
        }
        call.name = f["name"].get<std::string>();
        if (f.contains("arguments")) {
          if (!f["arguments"].is_string()) {
            return ApiInvalid(p + ".function.arguments",
                              "'arguments' must be a string (the arguments' JSON text)");
          }
          call.arguments = f["arguments"].get<std::string>();
        }
        for (auto g = f.begin(); g != f.end(); ++g) {
          if (g.key() != "name" && g.key() != "arguments") {
            return ApiInvalid(p + ".function." + g.key(),
                              absl::StrCat("Unrecognized tool call argument supplied: ", g.key()));
          }
        }
      } else {
        return ApiInvalid(p + "." + it.key(),
                          absl::StrCat("Unrecognized tool call argument supplied: ", it.key()));
      }
    }
    if (call.id.empty()) return ApiInvalid(p + ".id", "each tool call needs an 'id'");
    if (call.name.empty())
      return ApiInvalid(p + ".function", "each tool call needs a function name");
    out->push_back(std::move(call));
  }
  return ApiOk();
}

ApiError ParseMessages(const Json* messages, const ApiLimits& limits,
                       std::vector<ApiMessage>* out) {
  if (messages == nullptr) return ApiInvalid("messages", "'messages' is required");
  if (!messages->is_array()) return ApiInvalid("messages", "'messages' must be an array");
  if (messages->empty()) return ApiInvalid("messages", "'messages' must not be empty");
  if (messages->size() > limits.max_messages) {
    return ApiInvalid("messages", absl::StrCat("at most ", limits.max_messages, " messages"));
  }
  out->clear();
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return ApiInvalid(param, "each message must be an object");
    if (!m.contains("role") || !m["role"].is_string()) {
      return ApiInvalid(param + ".role", "each message needs a 'role', a string");
    }
    const std::string role = m["role"].get<std::string>();
    ApiMessage message;
    if (role == "system" || role == "developer") {
      message.role = ApiRole::kSystem;  // templates of open models know no developer role
    } else if (role == "user") {
      message.role = ApiRole::kUser;
    } else if (role == "assistant") {
      message.role = ApiRole::kAssistant;
    } else if (role == "tool") {
      message.role = ApiRole::kTool;
    } else {
      return ApiInvalid(
          param + ".role",
          absl::StrCat("unknown role '", role, "' (system, developer, user, assistant, tool)"));
    }
    bool has_content = false;
    for (auto it = m.begin(); it != m.end(); ++it) {
      const std::string& key = it.key();
      if (key == "role") continue;
      if (key == "content") {
        if (it->is_null()) continue;
        RETURN_IF_API_ERROR(ParseContent(*it, i, role == "user", limits, &message.content));
        has_content = true;
      } else if (key == "name") {
        if (!it->is_string()) return ApiInvalid(param + ".name", "must be a string");
        message.name = it->get<std::string>();
      } else if (key == "tool_call_id" && role == "tool") {
        if (!it->is_string()) return ApiInvalid(param + ".tool_call_id", "must be a string");
        message.tool_call_id = it->get<std::string>();
      } else if (key == "tool_calls" && role == "assistant") {
        if (it->is_null()) continue;
        RETURN_IF_API_ERROR(ParseToolCalls(*it, param + ".tool_calls", &message.tool_calls));
      } else if ((key == "reasoning_content" || key == "reasoning") && role == "assistant") {
        if (it->is_null()) continue;
        if (!it->is_string()) return ApiInvalid(param + "." + key, "must be a string");
        message.reasoning = it->get<std::string>();
      } else if (key == "refusal" || key == "audio") {
        if (!it->is_null() && key == "audio") {
          return ApiInvalid(param + ".audio", "audio is not supported by this server yet",
                            "unsupported_content");
        }
      } else {
        return ApiInvalid(param + "." + key,
                          absl::StrCat("Unrecognized message argument supplied: ", key));
      }
    }
    if (!has_content && (message.role != ApiRole::kAssistant || message.tool_calls.empty())) {
      return ApiInvalid(param + ".content", "the message has no content");
    }
    if (message.role == ApiRole::kTool && message.tool_call_id.empty()) {
      return ApiInvalid(param + ".tool_call_id",
                        "a tool message needs 'tool_call_id', the id of the call it answers");
    }
    out->push_back(std::move(message));
  }
  return ApiOk();
}

ApiError ParseTools(RequestFields& f, const ApiLimits& limits, ApiRequest* r) {
  const Json* tools = f.Get("tools");
  if (tools != nullptr) {
    if (!tools->is_array()) return ApiInvalid("tools", "'tools' must be an array");
    if (tools->size() > limits.max_tools) {
      return ApiInvalid("tools", absl::StrCat("'tools' has ", tools->size(), " entries; at most ",
                                              limits.max_tools));
    }
    if (tools->dump().size() > limits.max_tools_bytes) {
      return ApiInvalid("tools", absl::StrCat("the tool definitions take more than ",
                                              limits.max_tools_bytes, " bytes"));
    }
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string param = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return ApiInvalid(param, "each tool must be an object");
      if (!t.contains("type") || t["type"] != "function") {
        return ApiInvalid(param + ".type", "each tool's 'type' must be 'function'");
      }
      for (auto it = t.begin(); it != t.end(); ++it) {
        if (it.key() != "type" && it.key() != "function") {
          return ApiInvalid(param + "." + it.key(),
                            absl::StrCat("Unrecognized tool argument supplied: ", it.key()));
        }
      }
      if (!t.contains("function") || !t["function"].is_object()) {
        return ApiInvalid(param + ".function", "each tool needs 'function', an object");
      }
      const Json& fn = t["function"];
      ApiTool tool;
      for (auto it = fn.begin(); it != fn.end(); ++it) {
        const std::string p = param + ".function." + it.key();
        if (it.key() == "name") {
          if (!it->is_string()) return ApiInvalid(p, "'name' must be a string");
          tool.name = it->get<std::string>();
        } else if (it.key() == "description") {
          if (it->is_null()) continue;
          if (!it->is_string()) return ApiInvalid(p, "'description' must be a string");
          tool.description = it->get<std::string>();
        } else if (it.key() == "parameters") {
          if (it->is_null()) continue;
          RETURN_IF_API_ERROR(CheckFunctionSchema(*it, p));
          tool.parameters = *it;
        } else if (it.key() == "strict") {
          if (it->is_null()) continue;
          if (!it->is_boolean()) return ApiInvalid(p, "'strict' must be a boolean");
          tool.strict = it->get<bool>();
        } else {
          return ApiInvalid(p, absl::StrCat("Unrecognized function argument supplied: ", it.key()));
        }
      }
      if (!ValidFunctionName(tool.name)) {
        return ApiInvalid(param + ".function.name",
                          absl::StrCat("'", tool.name,
                                       "' is not a valid function name (1 to 64 of a-z, A-Z, 0-9, "
                                       "underscores and dashes)"));
      }
      if (!names.insert(tool.name).second) {
        return ApiInvalid(param + ".function.name",
                          absl::StrCat("two tools are named '", tool.name, "'"));
      }
      r->tools.push_back(std::move(tool));
    }
  }
  if (const Json* choice = f.Get("tool_choice"); choice != nullptr) {
    ApiToolChoice& c = r->tool_choice;
    if (choice->is_string()) {
      RETURN_IF_API_ERROR(ToolChoiceMode(choice->get<std::string>(), &c));
    } else if (choice->is_object()) {
      const Json* fn = choice->contains("function") ? &(*choice)["function"] : nullptr;
      if (!choice->contains("type") || (*choice)["type"] != "function" || fn == nullptr ||
          !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
        return ApiInvalid("tool_choice",
                          "a named 'tool_choice' is {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}");
      }
      c.mode = ApiToolChoice::Mode::kFunction;
      c.function = (*fn)["name"].get<std::string>();
    } else {
      return ApiInvalid("tool_choice", "'tool_choice' must be a string or an object");
    }
    RETURN_IF_API_ERROR(CheckToolChoice(*r));
  }
  RETURN_IF_API_ERROR(f.Bool("parallel_tool_calls", &r->parallel_tool_calls));
  return ApiOk();
}

// What chat and completions check last: min_tokens within the maximum (`maximum` names it in the
// message), a suffix only when empty (an empty suffix is no suffix), and no field left unread.
ApiError FinishCommon(RequestFields& f, const ApiRequest& r, const char* maximum) {
  if (r.sampling.min_tokens > 0 && r.sampling.max_tokens.has_value() &&
      r.sampling.min_tokens > *r.sampling.max_tokens) {
    return ApiInvalid("min_tokens", absl::StrCat("'min_tokens' must not exceed ", maximum));
  }
  if (const Json* suffix = f.Get("suffix"); suffix != nullptr) {
    if (!suffix->is_string() || !suffix->get<std::string>().empty()) {
      return ApiInvalid("suffix", "'suffix' is not supported by this server yet",
                        "unsupported_parameter");
    }
  }
  return f.CheckRest(Ignored(), Unsupported());
}

}  // namespace

ApiError ParseChatCompletion(absl::string_view body, const ApiLimits& limits, ApiRequest* r) {
  Json json;
  RETURN_IF_API_ERROR(ParseRequestJson(body, limits.json, &json));
  RequestFields f(json);
  r->kind = ApiKind::kChatCompletion;
  RETURN_IF_API_ERROR(ParseCommon(f, limits, r));
  RETURN_IF_API_ERROR(ParseMessages(f.Get("messages"), limits, &r->messages));
  RETURN_IF_API_ERROR(CheckImages(*r, limits));
  RETURN_IF_API_ERROR(ParseTools(f, limits, r));
  int64_t v = 0;
  bool present = false;
  RETURN_IF_API_ERROR(f.Integer("max_completion_tokens", 1, INT32_MAX, &v, &present));
  if (present) r->sampling.max_tokens = v;
  RETURN_IF_API_ERROR(f.Integer("max_tokens", 1, INT32_MAX, &v, &present));
  if (present) r->sampling.max_tokens = v;  // the older name wins when both are given
  RETURN_IF_API_ERROR(f.Bool("logprobs", &r->sampling.logprobs));
  RETURN_IF_API_ERROR(f.Integer("top_logprobs", 0, limits.max_top_logprobs, &v, &present));
  if (present) {
    if (!r->sampling.logprobs) {
      return ApiInvalid("top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
    }
    r->sampling.top_logprobs = static_cast<int32_t>(v);
  }
  if (const Json* format = f.Get("response_format"); format != nullptr) {
    RETURN_IF_API_ERROR(ParseChatResponseFormat(*format, &r->output_format));
  }
  RETURN_IF_API_ERROR(ParseVllmStructuredOutputs(f, &r->output_format));
  if (const Json* modalities = f.Get("modalities"); modalities != nullptr) {
    if (*modalities != Json::array({"text"})) {
      return ApiInvalid("modalities", "only the text modality is supported",
                        "unsupported_parameter");
    }
  }
  return FinishCommon(f, *r, "the maximum tokens");
}

ApiError ParseCompletion(absl::string_view body, const ApiLimits& limits, ApiRequest* r) {
  Json json;
  RETURN_IF_API_ERROR(ParseRequestJson(body, limits.json, &json));
  RequestFields f(json);
  r->kind = ApiKind::kCompletion;
  RETURN_IF_API_ERROR(ParseCommon(f, limits, r));
  const Json* prompt = f.Get("prompt");
  if (prompt == nullptr) return ApiInvalid("prompt", "'prompt' is required");
  // A string, a list of token ids, or a list holding one of those (batches of prompts are
  // OpenAI's; ask with n instead).
  const Json* p = prompt;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];
  }
  if (p->is_string()) {
    r->prompt_text = p->get<std::string>();
    if (r->prompt_text.empty()) return ApiInvalid("prompt", "'prompt' is empty");
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number_integer()) {
    for (const Json& id : *p) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= limits.vocab_size) {
        return ApiInvalid("prompt", absl::StrCat("'prompt' token ids must be integers in [0, ",
                                                 limits.vocab_size - 1, "]"));
      }
      r->prompt_ids.push_back(static_cast<TokenId>(id.get<int64_t>()));
    }
    r->prompt_is_ids = true;
  } else if (p->is_array() && p->empty()) {
    return ApiInvalid("prompt", "'prompt' is empty");
  } else if (prompt->is_array()) {
    return ApiInvalid("prompt", "a list of several prompts is not supported; send one per request",
                      "unsupported_parameter");
  } else {
    return ApiInvalid("prompt", "'prompt' must be a string or a list of token ids");
  }
  int64_t v = 0;
  bool present = false;
  RETURN_IF_API_ERROR(f.Integer("max_tokens", 1, INT32_MAX, &v, &present));
  if (present) r->sampling.max_tokens = v;
  RETURN_IF_API_ERROR(f.Integer("logprobs", 0, limits.max_completion_logprobs, &v, &present));
  if (present) {
    r->sampling.logprobs = true;
    r->sampling.top_logprobs = static_cast<int32_t>(v);
  }
  RETURN_IF_API_ERROR(f.Bool("echo", &r->echo));
  if (r->echo && r->sampling.logprobs) {
    return ApiInvalid("echo",
                      "'echo' with 'logprobs' needs prompt logprobs, which this server does "
                      "not compute yet",
                      "unsupported_parameter");
  }
  RETURN_IF_API_ERROR(f.Integer("best_of", 1, limits.max_n, &v, &present));
  if (present && v != r->sampling.n) {
    return ApiInvalid("best_of", "'best_of' other than n is not supported",
                      "unsupported_parameter");
  }
  RETURN_IF_API_ERROR(ParseVllmStructuredOutputs(f, &r->output_format));
  return FinishCommon(f, *r, "'max_tokens'");
}

}  // namespace ferry
