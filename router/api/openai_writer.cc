#include "router/api/openai_writer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "router/api/json_string.h"
#include "router/http/http_status.h"

namespace ferry {

using Json = nlohmann::ordered_json;

namespace {

// OpenAI never sends -inf: the most negative logprob it reports is -9999.0.
double FiniteLogprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

}  // namespace

std::string DumpJson(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

OpenAiWriter::OpenAiWriter(ResponseHeader header, const Tokenizer* tokenizer, bool logprobs,
                           std::string echo_prompt, bool include_usage, bool return_token_ids,
                           std::vector<TokenId> prompt_token_ids)
    : header_(std::move(header)),
      tokenizer_(tokenizer),
      logprobs_(logprobs),
      echo_prompt_(std::move(echo_prompt)),
      include_usage_(include_usage),
      return_token_ids_(return_token_ids),
      prompt_token_ids_(std::move(prompt_token_ids)) {}

Json OpenAiWriter::Object(bool chunk) const {
  Json j = Json::object();
  j["id"] = header_.id;
  if (header_.kind == ApiKind::kChatCompletion) {
    j["object"] = chunk ? "chat.completion.chunk" : "chat.completion";
  } else {
    j["object"] = "text_completion";
  }
  j["created"] = header_.created;
  j["model"] = header_.model;
  j["system_fingerprint"] = header_.system_fingerprint;
  j["choices"] = Json::array();
  return j;
}

Json OpenAiWriter::TokenEntry(TokenId token, float logprob) const {
  Json e = Json::object();
  auto text = tokenizer_->Decode({&token, 1});
  auto bytes = tokenizer_->DecodeBytes({&token, 1});
  e["token"] = text.ok() ? *text : "";
  e["logprob"] = FiniteLogprob(logprob);
  Json b = Json::array();
  if (bytes.ok()) {
    for (unsigned char c : *bytes) b.push_back(static_cast<int>(c));
  }
  e["bytes"] = b;
  return e;
}

Json OpenAiWriter::Logprobs(const ChoiceOutputs& c, int64_t text_offset) const {
  if (!logprobs_) return nullptr;
  if (header_.kind == ApiKind::kChatCompletion) {
    Json content = Json::array();
    for (const TokenLogprob& lp : c.logprobs) {
      Json e = TokenEntry(lp.token, lp.logprob);
      Json top = Json::array();
      for (const auto& [token, logprob] : lp.top) top.push_back(TokenEntry(token, logprob));
      e["top_logprobs"] = top;
      content.push_back(std::move(e));
    }
    Json j = Json::object();
    j["content"] = content;
    j["refusal"] = nullptr;
    return j;
  }
  // Completions: parallel lists, and the text offset of each token.
  Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
       offsets = Json::array();
  int64_t offset = text_offset;
  for (const TokenLogprob& lp : c.logprobs) {
    auto text = tokenizer_->Decode({&lp.token, 1});
    const std::string t = text.ok() ? *text : "";
    tokens.push_back(t);
    token_logprobs.push_back(FiniteLogprob(lp.logprob));
    Json alternatives = Json::object();
    for (const auto& [token, logprob] : lp.top) {
      auto alt = tokenizer_->Decode({&token, 1});
      alternatives[alt.ok() ? *alt : ""] = FiniteLogprob(logprob);
    }
    top.push_back(alternatives);
    offsets.push_back(offset);
    offset += static_cast<int64_t>(t.size());
  }
  Json j = Json::object();
  j["tokens"] = tokens;
  j["token_logprobs"] = token_logprobs;
  j["top_logprobs"] = top;
  j["text_offset"] = offsets;
  return j;
}

Json OpenAiWriter::Usage(const UsageCounts& u) const {
  Json j = Json::object();
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = Json{{"cached_tokens", u.cached_tokens}};
  if (header_.kind == ApiKind::kChatCompletion) {
    j["completion_tokens_details"] = Json{{"reasoning_tokens", u.reasoning_tokens}};
  }
  return j;
}

std::string OpenAiWriter::Full(const std::vector<ChoiceOutputs>& choices,
                               const UsageCounts& usage) {
  Json j = Object(false);
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceOutputs& c = choices[i];
    Json choice = Json::object();
    choice["index"] = i;
    if (header_.kind == ApiKind::kChatCompletion) {
      Json message = Json::object();
      message["role"] = "assistant";
      message["content"] = c.text.empty() && !c.tool_calls.empty() ? Json(nullptr) : Json(c.text);
      if (!c.reasoning.empty()) message["reasoning_content"] = c.reasoning;
      message["refusal"] = nullptr;
      if (!c.tool_calls.empty()) {
        Json calls = Json::array();
        for (const ApiToolCall& call : c.tool_calls) {
          calls.push_back(
              Json{{"id", call.id},
                   {"type", "function"},
                   {"function", Json{{"name", call.name}, {"arguments", call.arguments}}}});
        }
        message["tool_calls"] = std::move(calls);
      }
      choice["message"] = std::move(message);
      choice["logprobs"] = Logprobs(c, 0);
    } else {
      choice["text"] = echo_prompt_ + c.text;
      choice["logprobs"] = Logprobs(c, static_cast<int64_t>(echo_prompt_.size()));
    }
    choice["finish_reason"] = c.finish_reason.empty() ? Json(nullptr) : Json(c.finish_reason);
    if (return_token_ids_) {
      choice["token_ids"] = c.tokens;
      choice["prompt_token_ids"] = prompt_token_ids_;
    }
    j["choices"].push_back(std::move(choice));
  }
  j["usage"] = Usage(usage);
  return DumpJson(j);
}

std::string OpenAiWriter::StreamStart(int32_t choice) {
  Json j = Object(true);
  Json c = Json::object();
  c["index"] = choice;
  if (header_.kind == ApiKind::kChatCompletion) {
    c["delta"] = Json{{"role", "assistant"}, {"content", ""}};
  } else {
    if (echo_prompt_.empty() && !return_token_ids_) return "";
    c["text"] = echo_prompt_;
  }
  c["logprobs"] = nullptr;
  c["finish_reason"] = nullptr;
  if (return_token_ids_) {
    c["token_ids"] = Json::array();
    c["prompt_token_ids"] = prompt_token_ids_;
  }
  j["choices"].push_back(std::move(c));
  if (include_usage_) j["usage"] = nullptr;
  return "data: " + DumpJson(j) + "\n\n";
}

std::string OpenAiWriter::StreamDelta(int32_t choice, const ChoiceOutputs& delta) {
  // The common event, text alone: the choice's template around the escaped text (the same bytes
  // as the document below; json_string.h).
  if (!delta.text.empty() && delta.reasoning.empty() && delta.tool_call_deltas.empty() &&
      delta.logprobs.empty() && delta.finish_reason.empty() && !return_token_ids_ && choice >= 0 &&
      choice < 1024) {
    if (text_templates_.size() <= static_cast<size_t>(choice)) {
      text_templates_.resize(static_cast<size_t>(choice) + 1);
    }
    TextTemplate& t = text_templates_[static_cast<size_t>(choice)];
    if (!t.built) {
      t.built = true;
      constexpr absl::string_view kMarker = "ferry-text-marker-5e1f";
      ChoiceOutputs marked;
      marked.text = std::string(kMarker);
      const std::string event = StreamDeltaDocument(choice, marked);
      const std::string quoted = absl::StrCat("\"", kMarker, "\"");
      const size_t at = event.find(quoted);
      if (at != std::string::npos && event.find(quoted, at + 1) == std::string::npos) {
        t.prefix = event.substr(0, at);
        t.suffix = event.substr(at + quoted.size());
        t.usable = true;
      }
    }
    if (t.usable) {
      std::string out;
      out.reserve(t.prefix.size() + delta.text.size() + t.suffix.size() + 8);
      out += t.prefix;
      if (AppendJsonString(delta.text, &out)) return out + t.suffix;
    }
  }
  return StreamDeltaDocument(choice, delta);
}

std::string OpenAiWriter::StreamDeltaDocument(int32_t choice, const ChoiceOutputs& delta) {
  Json j = Object(true);
  Json c = Json::object();
  c["index"] = choice;
  if (header_.kind == ApiKind::kChatCompletion) {
    Json d = Json::object();
    if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
    if (!delta.text.empty()) d["content"] = delta.text;
    if (!delta.tool_call_deltas.empty()) {
      Json calls = Json::array();
      for (const ToolCallDelta& t : delta.tool_call_deltas) {
        Json call = Json::object();
        call["index"] = t.index;
        Json fn = Json::object();
        if (!t.id.empty()) {
          call["id"] = t.id;
          call["type"] = "function";
          fn["name"] = t.name;
        }
        fn["arguments"] = t.arguments;
        call["function"] = std::move(fn);
        calls.push_back(std::move(call));
      }
      d["tool_calls"] = std::move(calls);
    }
    if (d.empty() && delta.finish_reason.empty()) d["content"] = "";
    c["delta"] = std::move(d);
  } else {
    c["text"] = delta.text;
  }
  c["logprobs"] = delta.logprobs.empty() ? Json(nullptr) : Logprobs(delta, 0);
  c["finish_reason"] = delta.finish_reason.empty() ? Json(nullptr) : Json(delta.finish_reason);
  if (return_token_ids_) c["token_ids"] = delta.tokens;
  j["choices"].push_back(std::move(c));
  if (include_usage_) j["usage"] = nullptr;
  return "data: " + DumpJson(j) + "\n\n";
}

std::string OpenAiWriter::StreamEnd(const std::vector<ChoiceOutputs>& choices,
                                    const UsageCounts& usage) {
  std::string out;
  if (include_usage_) {
    Json j = Object(true);
    j["usage"] = Usage(usage);
    out = "data: " + DumpJson(j) + "\n\n";
  }
  return out + "data: [DONE]\n\n";
}

std::string OpenAiWriter::StreamError(const ApiError& error, const std::string& trace_id) {
  return "data: " + OpenAiErrorBody(error.status, trace_id, error.param, error.code) + "\n\n";
}

}  // namespace ferry
