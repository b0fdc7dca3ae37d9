#include "router/api/anthropic_writer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "router/api/bounded_json.h"
#include "router/api/openai_writer.h"  // DumpJson
#include "router/http/http_status.h"

namespace ferry {
namespace {

using Json = nlohmann::ordered_json;

std::string Event(const char* type, const Json& data) {
  return absl::StrCat("event: ", type, "\ndata: ", DumpJson(data), "\n\n");
}

// A tool call's arguments as its `input`: the JSON object they are, or {} (also when they break
// the default JsonLimits: nested deeper than 128 levels, say; dumping JSON recurses). Parsed in
// linear time: the model's text, as long as max_tokens lets it be.
Json ToolInput(const std::string& arguments) {
  Json input;
  if (!ParseBoundedJson(arguments, JsonLimits{}, &input).ok() || !input.is_object()) {
    return Json::object();
  }
  return input;
}

// stop_reason and stop_sequence for a choice's finish.
std::pair<Json, Json> StopReason(const ChoiceOutputs& c) {
  if (c.finish_reason == "stop") {
    if (!c.matched_stop.empty()) return {"stop_sequence", c.matched_stop};
    return {"end_turn", nullptr};
  }
  if (c.finish_reason == "length") return {"max_tokens", nullptr};
  if (c.finish_reason == "tool_calls") return {"tool_use", nullptr};
  return {"end_turn", nullptr};
}

Json Usage(const UsageCounts& u) {
  Json j = Json::object();
  j["input_tokens"] = std::max<int64_t>(0, u.prompt_tokens - u.cached_tokens);
  j["cache_creation_input_tokens"] = 0;
  j["cache_read_input_tokens"] = u.cached_tokens;
  j["output_tokens"] = u.completion_tokens;
  if (u.reasoning_tokens > 0) {
    j["output_tokens_details"] = Json{{"thinking_tokens", u.reasoning_tokens}};
  }
  return j;
}

}  // namespace

AnthropicWriter::AnthropicWriter(std::string id, std::string model, int64_t prompt_tokens)
    : id_(std::move(id)), model_(std::move(model)), prompt_tokens_(prompt_tokens) {}

std::string AnthropicWriter::Full(const std::vector<ChoiceOutputs>& choices,
                                  const UsageCounts& usage) {
  const ChoiceOutputs none;
  const ChoiceOutputs& c = choices.empty() ? none : choices[0];
  Json content = Json::array();
  if (!c.reasoning.empty()) {
    content.push_back(Json{{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
  }
  if (!c.text.empty()) content.push_back(Json{{"type", "text"}, {"text", c.text}});
  for (const ApiToolCall& call : c.tool_calls) {
    content.push_back(Json{{"type", "tool_use"},
                           {"id", call.id},
                           {"name", call.name},
                           {"input", ToolInput(call.arguments)}});
  }
  auto [stop_reason, stop_sequence] = StopReason(c);
  Json j = Json::object();
  j["id"] = id_;
  j["type"] = "message";
  j["role"] = "assistant";
  j["model"] = model_;
  j["content"] = std::move(content);
  j["stop_reason"] = std::move(stop_reason);
  j["stop_sequence"] = std::move(stop_sequence);
  j["usage"] = Usage(usage);
  return DumpJson(j);
}

std::string AnthropicWriter::StreamStart(int32_t choice) {
  if (choice != 0 || started_) return "";
  started_ = true;
  Json message = Json::object();
  message["id"] = id_;
  message["type"] = "message";
  message["role"] = "assistant";
  message["content"] = Json::array();
  message["model"] = model_;
  message["stop_reason"] = nullptr;
  message["stop_sequence"] = nullptr;
  message["usage"] = Json{{"input_tokens", prompt_tokens_},
                          {"cache_creation_input_tokens", 0},
                          {"cache_read_input_tokens", 0},
                          {"output_tokens", 0}};
  return Event("message_start", Json{{"type", "message_start"}, {"message", std::move(message)}}) +
         Event("ping", Json{{"type", "ping"}});
}

std::string AnthropicWriter::Open(Block kind, Json content_block) {
  std::string out = Close();
  open_ = kind;
  open_index_ = next_index_++;
  out += Event("content_block_start", Json{{"type", "content_block_start"},
                                           {"index", open_index_},
                                           {"content_block", std::move(content_block)}});
  return out;
}

std::string AnthropicWriter::Close() {
  if (open_ == Block::kNone) return "";
  std::string out;
  if (open_ == Block::kThinking) {
    out += Event("content_block_delta",
                 Json{{"type", "content_block_delta"},
                      {"index", open_index_},
                      {"delta", Json{{"type", "signature_delta"}, {"signature", ""}}}});
  }
  out += Event("content_block_stop", Json{{"type", "content_block_stop"}, {"index", open_index_}});
  open_ = Block::kNone;
  return out;
}

std::string AnthropicWriter::StreamDelta(int32_t choice, const ChoiceOutputs& delta) {
  if (choice != 0) return "";
  std::string out = StreamStart(0);  // "" once started
  if (!delta.reasoning.empty()) {
    if (open_ != Block::kThinking) {
      out +=
          Open(Block::kThinking, Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
    }
    out += Event("content_block_delta",
                 Json{{"type", "content_block_delta"},
                      {"index", open_index_},
                      {"delta", Json{{"type", "thinking_delta"}, {"thinking", delta.reasoning}}}});
  }
  if (!delta.text.empty()) {
    if (open_ != Block::kText) out += Open(Block::kText, Json{{"type", "text"}, {"text", ""}});
    out += Event("content_block_delta",
                 Json{{"type", "content_block_delta"},
                      {"index", open_index_},
                      {"delta", Json{{"type", "text_delta"}, {"text", delta.text}}}});
  }
  for (const ToolCallDelta& t : delta.tool_call_deltas) {
    if (!t.id.empty()) {  // a call's first piece
      out += Open(
          Block::kToolUse,
          Json{{"type", "tool_use"}, {"id", t.id}, {"name", t.name}, {"input", Json::object()}});
      call_blocks_[t.index] = open_index_;
    }
    auto block = call_blocks_.find(t.index);
    // A piece of a call that never began has no block (the tool-call parser sends none); one of
    // a call whose block was closed goes to that block's index.
    if (block == call_blocks_.end() || t.arguments.empty()) continue;
    out +=
        Event("content_block_delta",
              Json{{"type", "content_block_delta"},
                   {"index", block->second},
                   {"delta", Json{{"type", "input_json_delta"}, {"partial_json", t.arguments}}}});
  }
  return out;
}

std::string AnthropicWriter::StreamEnd(const std::vector<ChoiceOutputs>& choices,
                                       const UsageCounts& usage) {
  const ChoiceOutputs none;
  const ChoiceOutputs& c = choices.empty() ? none : choices[0];
  std::string out = StreamStart(0);  // "" once started
  out += Close();
  auto [stop_reason, stop_sequence] = StopReason(c);
  out += Event("message_delta", Json{{"type", "message_delta"},
                                     {"delta", Json{{"stop_reason", std::move(stop_reason)},
                                                    {"stop_sequence", std::move(stop_sequence)}}},
                                     {"usage", Usage(usage)}});
  out += Event("message_stop", Json{{"type", "message_stop"}});
  return out;
}

std::string AnthropicWriter::StreamError(const ApiError& error, const std::string& trace_id) {
  return absl::StrCat("event: error\ndata: ", AnthropicErrorBody(error.status, trace_id), "\n\n");
}

int AnthropicHttpStatus(absl::StatusCode code) {
  const int status = HttpStatusCode(code);
  return status == 503 ? 529 : status;
}

absl::string_view AnthropicErrorType(int http_status) {
  switch (http_status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 402:
      return "billing_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 504:
      return "timeout_error";
    case 529:
      return "overloaded_error";
    default:
      return "api_error";
  }
}

std::string AnthropicErrorBody(const absl::Status& status, absl::string_view trace_id) {
  const std::string message = status.message().empty() ? absl::StatusCodeToString(status.code())
                                                       : std::string(status.message());
  Json j = Json::object();
  j["type"] = "error";
  j["error"] = Json{{"type", std::string(AnthropicErrorType(AnthropicHttpStatus(status.code())))},
                    {"message", message}};
  j["request_id"] = trace_id.empty() ? Json(nullptr) : Json(std::string(trace_id));
  return DumpJson(j);
}

}  // namespace ferry
