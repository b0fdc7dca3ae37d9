#include "router/api/responses_writer.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "router/api/openai_writer.h"

namespace ferry {

using Json = nlohmann::ordered_json;

namespace {

// A sampling setting as the client wrote it: 0.7, not the float's 0.699999988079071.
double Echo(float value) {
  double d = value;
  if (!absl::SimpleAtod(absl::StrCat(value), &d)) d = value;
  return d;
}

Json StringOrNull(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

Json ToolChoiceJson(const ApiToolChoice& choice) {
  switch (choice.mode) {
    case ApiToolChoice::Mode::kNone:
      return "none";
    case ApiToolChoice::Mode::kRequired:
      return "required";
    case ApiToolChoice::Mode::kFunction:
      return Json{{"type", "function"}, {"name", choice.function}};
    case ApiToolChoice::Mode::kAuto:
    default:
      return "auto";
  }
}

Json OutputTextPart(const std::string& text) {
  return Json{{"type", "output_text"}, {"text", text}, {"annotations", Json::array()}};
}

Json ReasoningTextPart(const std::string& text) {
  return Json{{"type", "reasoning_text"}, {"text", text}};
}

}  // namespace

ResponsesWriter::ResponsesWriter(std::string id, int64_t created_at, const ApiRequest& request,
                                 std::vector<ApiMessage> history, ResponseStore* store,
                                 std::string tenant)
    : id_(std::move(id)),
      item_suffix_(absl::StartsWith(id_, "resp_") ? id_.substr(5) : id_),
      created_at_(created_at),
      store_requested_(request.store),
      history_(std::move(history)),
      store_(store),
      tenant_(std::move(tenant)) {
  echo_ = Json::object();
  echo_["instructions"] = StringOrNull(request.instructions);
  echo_["max_output_tokens"] =
      request.sampling.max_tokens.has_value() ? Json(*request.sampling.max_tokens) : Json(nullptr);
  echo_["model"] = request.model;
  echo_["parallel_tool_calls"] = request.parallel_tool_calls;
  echo_["previous_response_id"] = StringOrNull(request.previous_response_id);
  echo_["reasoning"] = Json{{"effort", nullptr}, {"summary", nullptr}};
  echo_["store"] = request.store;
  echo_["temperature"] = Echo(request.sampling.temperature);
  echo_["text"] = Json{{"format", Json{{"type", "text"}}}};
  echo_["tool_choice"] = ToolChoiceJson(request.tool_choice);
  Json tools = Json::array();
  for (const ApiTool& tool : request.tools) {
    Json t = Json::object();
    t["type"] = "function";
    t["name"] = tool.name;
    t["description"] = StringOrNull(tool.description);
    t["parameters"] = tool.parameters;
    t["strict"] = tool.strict.has_value() ? Json(*tool.strict) : Json(nullptr);
    tools.push_back(std::move(t));
  }
  echo_["tools"] = std::move(tools);
  echo_["top_p"] = Echo(request.sampling.top_p);
  echo_["truncation"] = "disabled";
  echo_["user"] = StringOrNull(request.user);
  Json metadata = Json::object();
  if (request.metadata.is_object()) {
    for (auto it = request.metadata.begin(); it != request.metadata.end(); ++it) {
      if (it->is_string()) metadata[it.key()] = it->get<std::string>();
    }
  }
  echo_["metadata"] = std::move(metadata);
}

Json ResponsesWriter::ItemJson(const Item& item) const {
  const bool complete = !item.status.empty();
  Json j = Json::object();
  j["id"] = item.id;
  switch (item.kind) {
    case ItemKind::kReasoning:
      j["type"] = "reasoning";
      j["summary"] = Json::array();
      j["content"] = complete ? Json::array({ReasoningTextPart(item.text)}) : Json::array();
      break;
    case ItemKind::kMessage:
      j["type"] = "message";
      j["status"] = complete ? item.status : "in_progress";
      j["content"] = complete ? Json::array({OutputTextPart(item.text)}) : Json::array();
      j["role"] = "assistant";
      break;
    case ItemKind::kFunctionCall:
      j["type"] = "function_call";
      j["status"] = complete ? item.status : "in_progress";
      j["arguments"] = complete ? item.text : "";
      j["call_id"] = item.call_id;
      j["name"] = item.name;
      break;
  }
  return j;
}

Json ResponsesWriter::ResponseJson(const std::string& status, const std::string& reason,
                                   const UsageCounts* usage) const {
  Json j = Json::object();
  j["id"] = id_;
  j["object"] = "response";
  j["created_at"] = created_at_;
  j["status"] = status;
  j["error"] = nullptr;
  j["incomplete_details"] = reason.empty() ? Json(nullptr) : Json{{"reason", reason}};
  for (auto it = echo_.begin(); it != echo_.end(); ++it) {
    if (it.key() == "parallel_tool_calls") {
      // `output` sits between model and parallel_tool_calls in OpenAI's field order.
      Json output = Json::array();
      for (const Item& item : items_) output.push_back(ItemJson(item));
      j["output"] = std::move(output);
    }
    if (it.key() == "user") {
      if (usage == nullptr) {
        j["usage"] = nullptr;
      } else {
        j["usage"] =
            Json{{"input_tokens", usage->prompt_tokens},
                 {"input_tokens_details",
                  Json{{"cached_tokens", usage->cached_tokens}, {"cache_write_tokens", 0}}},
                 {"output_tokens", usage->completion_tokens},
                 {"output_tokens_details", Json{{"reasoning_tokens", usage->reasoning_tokens}}},
                 {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
      }
    }
    j[it.key()] = it.value();
  }
  return j;
}

std::string ResponsesWriter::Event(const char* type, Json fields) {
  Json j = Json::object();
  j["type"] = type;
  for (auto it = fields.begin(); it != fields.end(); ++it) j[it.key()] = std::move(it.value());
  j["sequence_number"] = sequence_++;
  return absl::StrCat("event: ", type, "\ndata: ", DumpJson(j), "\n\n");
}

void ResponsesWriter::Add(Item item, std::string* out) {
  CloseOpen("completed", out);
  const size_t index = items_.size();
  const char* prefix = item.kind == ItemKind::kReasoning ? "rs_"
                       : item.kind == ItemKind::kMessage ? "msg_"
                                                         : "fc_";
  item.id = absl::StrCat(prefix, item_suffix_, "_", index);
  item.status.clear();
  items_.push_back(std::move(item));
  open_ = static_cast<int>(index);
  const Item& added = items_.back();
  *out +=
      Event("response.output_item.added", Json{{"output_index", index}, {"item", ItemJson(added)}});
  if (added.kind == ItemKind::kFunctionCall) return;
  *out += Event("response.content_part.added",
                Json{{"item_id", added.id},
                     {"output_index", index},
                     {"content_index", 0},
                     {"part", added.kind == ItemKind::kReasoning ? ReasoningTextPart("")
                                                                 : OutputTextPart("")}});
}

void ResponsesWriter::CloseOpen(const std::string& status, std::string* out) {
  if (open_ < 0) return;
  const size_t index = static_cast<size_t>(open_);
  open_ = -1;
  Item& item = items_[index];
  item.status = status;
  switch (item.kind) {
    case ItemKind::kReasoning:
      *out += Event("response.reasoning_text.done", Json{{"item_id", item.id},
                                                         {"output_index", index},
                                                         {"content_index", 0},
                                                         {"text", item.text}});
      *out += Event("response.content_part.done", Json{{"item_id", item.id},
                                                       {"output_index", index},
                                                       {"content_index", 0},
                                                       {"part", ReasoningTextPart(item.text)}});
      break;
    case ItemKind::kMessage:
      *out += Event("response.output_text.done", Json{{"item_id", item.id},
                                                      {"output_index", index},
                                                      {"content_index", 0},
                                                      {"text", item.text},
                                                      {"logprobs", Json::array()}});
      *out += Event("response.content_part.done", Json{{"item_id", item.id},
                                                       {"output_index", index},
                                                       {"content_index", 0},
                                                       {"part", OutputTextPart(item.text)}});
      break;
    case ItemKind::kFunctionCall:
      *out += Event("response.function_call_arguments.done",
                    Json{{"item_id", item.id}, {"output_index", index}, {"arguments", item.text}});
      break;
  }
  *out +=
      Event("response.output_item.done", Json{{"output_index", index}, {"item", ItemJson(item)}});
}

void ResponsesWriter::AppendText(ItemKind kind, const std::string& text, std::string* out) {
  if (text.empty()) return;
  if (open_ < 0 || items_[open_].kind != kind) {
    Item item;
    item.kind = kind;
    Add(std::move(item), out);
  }
  Item& item = items_[open_];
  item.text += text;
  const size_t index = static_cast<size_t>(open_);
  if (kind == ItemKind::kReasoning) {
    *out += Event(
        "response.reasoning_text.delta",
        Json{{"item_id", item.id}, {"output_index", index}, {"content_index", 0}, {"delta", text}});
  } else {
    *out += Event("response.output_text.delta", Json{{"item_id", item.id},
                                                     {"output_index", index},
                                                     {"content_index", 0},
                                                     {"delta", text},
                                                     {"logprobs", Json::array()}});
  }
}

void ResponsesWriter::AppendToolCall(const ToolCallDelta& delta, std::string* out) {
  int found = -1;
  for (size_t i = 0; i < items_.size(); ++i) {
    if (items_[i].kind == ItemKind::kFunctionCall && items_[i].tool_index == delta.index) {
      found = static_cast<int>(i);
    }
  }
  if (found < 0) {
    Item item;
    item.kind = ItemKind::kFunctionCall;
    item.call_id = delta.id;
    item.name = delta.name;
    item.tool_index = delta.index;
    Add(std::move(item), out);
    found = open_;
  } else if (found != open_) {
    return;  // a piece of a call already done (the upstream's contract is one call at a time)
  }
  if (delta.arguments.empty()) return;
  Item& item = items_[found];
  item.text += delta.arguments;
  *out += Event("response.function_call_arguments.delta",
                Json{{"item_id", item.id}, {"output_index", found}, {"delta", delta.arguments}});
}

// Streams what `choice` (the whole answer) holds beyond what the deltas brought, and closes the
// open item.
void ResponsesWriter::Finish(const ChoiceOutputs& choice, std::string* out) {
  std::string reasoning, text;
  for (const Item& item : items_) {
    if (item.kind == ItemKind::kReasoning) reasoning += item.text;
    if (item.kind == ItemKind::kMessage) text += item.text;
  }
  if (choice.reasoning.size() > reasoning.size() && absl::StartsWith(choice.reasoning, reasoning)) {
    AppendText(ItemKind::kReasoning, choice.reasoning.substr(reasoning.size()), out);
  }
  if (choice.text.size() > text.size() && absl::StartsWith(choice.text, text)) {
    AppendText(ItemKind::kMessage, choice.text.substr(text.size()), out);
  }
  for (const ApiToolCall& call : choice.tool_calls) {
    Item* streamed = nullptr;
    for (Item& item : items_) {
      if (item.kind == ItemKind::kFunctionCall && item.call_id == call.id) streamed = &item;
    }
    if (streamed == nullptr) {
      Item item;
      item.kind = ItemKind::kFunctionCall;
      item.call_id = call.id;
      item.name = call.name;
      Add(std::move(item), out);
      if (!call.arguments.empty()) {
        items_[open_].text = call.arguments;
        *out += Event("response.function_call_arguments.delta", Json{{"item_id", items_[open_].id},
                                                                     {"output_index", open_},
                                                                     {"delta", call.arguments}});
      }
    } else if (streamed->status.empty()) {
      streamed->text = call.arguments;  // the done event carries the parser's final text
    }
  }
  CloseOpen(choice.finish_reason == "length" ? "incomplete" : "completed", out);
}

void ResponsesWriter::Store(const std::string& response_json) {
  if (store_ == nullptr || !store_requested_) return;
  ApiMessage answer;
  answer.role = ApiRole::kAssistant;
  std::string text;
  for (const Item& item : items_) {
    switch (item.kind) {
      case ItemKind::kReasoning:
        answer.reasoning += item.text;  // as the choice's reasoning: the deltas joined
        break;
      case ItemKind::kMessage:
        text += item.text;
        break;
      case ItemKind::kFunctionCall:
        answer.tool_calls.push_back({item.call_id, item.name, item.text});
        break;
    }
  }
  answer.content.push_back({std::move(text)});
  StoredResponse response;
  response.id = id_;
  response.tenant = tenant_;
  response.response_json = response_json;
  response.conversation = std::move(history_);
  history_.clear();
  response.conversation.push_back(std::move(answer));
  stored_ = store_->Put(std::move(response));
}

std::string ResponsesWriter::Full(const std::vector<ChoiceOutputs>& choices,
                                  const UsageCounts& usage) {
  const ChoiceOutputs choice = choices.empty() ? ChoiceOutputs() : choices[0];
  items_.clear();
  std::string ignored;  // no events: Full writes the body only
  Finish(choice, &ignored);
  ended_ = true;
  const bool incomplete = choice.finish_reason == "length";
  const std::string body = DumpJson(ResponseJson(incomplete ? "incomplete" : "completed",
                                                 incomplete ? "max_output_tokens" : "", &usage));
  Store(body);
  return body;
}

std::string ResponsesWriter::StreamStart(int32_t choice) {
  if (choice != 0 || started_ || ended_) return "";
  started_ = true;
  const Json response = ResponseJson("in_progress", "", nullptr);
  std::string out = Event("response.created", Json{{"response", response}});
  out += Event("response.in_progress", Json{{"response", response}});
  return out;
}

std::string ResponsesWriter::StreamDelta(int32_t choice, const ChoiceOutputs& delta) {
  if (choice != 0 || ended_) return "";
  std::string out = StreamStart(0);
  AppendText(ItemKind::kReasoning, delta.reasoning, &out);
  AppendText(ItemKind::kMessage, delta.text, &out);
  for (const ToolCallDelta& call : delta.tool_call_deltas) AppendToolCall(call, &out);
  return out;
}

std::string ResponsesWriter::StreamEnd(const std::vector<ChoiceOutputs>& choices,
                                       const UsageCounts& usage) {
  if (ended_) return "";
  std::string out = StreamStart(0);
  const ChoiceOutputs choice = choices.empty() ? ChoiceOutputs() : choices[0];
  Finish(choice, &out);
  ended_ = true;
  const bool incomplete = choice.finish_reason == "length";
  const Json response = ResponseJson(incomplete ? "incomplete" : "completed",
                                     incomplete ? "max_output_tokens" : "", &usage);
  out += Event(incomplete ? "response.incomplete" : "response.completed",
               Json{{"response", response}});
  Store(DumpJson(response));
  return out;
}

// The trace id is in the stream's x-request-id header; the SDK's error event has no field for it.
std::string ResponsesWriter::StreamError(const ApiError& error, const std::string& /*trace_id*/) {
  if (ended_) return "";
  ended_ = true;
  const std::string code =
      error.code.empty() ? absl::AsciiStrToLower(absl::StatusCodeToString(error.status.code()))
                         : error.code;
  return Event("error", Json{{"code", code},
                             {"message", std::string(error.status.message())},
                             {"param", StringOrNull(error.param)}});
}

}  // namespace ferry
