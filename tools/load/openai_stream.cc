#include "tools/load/openai_stream.h"

#include "nlohmann/json.hpp"

namespace ferry {
namespace {

int64_t IntegerAt(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
}

}  // namespace

int OpenAiStreamReader::Feed(absl::string_view bytes) {
  int events = 0;
  size_t at = 0;
  while (at < bytes.size()) {
    const size_t end = bytes.find('\n', at);
    if (end == absl::string_view::npos) {
      pending_.append(bytes.data() + at, bytes.size() - at);
      break;
    }
    pending_.append(bytes.data() + at, end - at);
    at = end + 1;
    if (!pending_.empty() && pending_.back() == '\r') pending_.pop_back();
    if (pending_.empty()) {  // a blank line ends the event
      if (has_data_ && Event(data_)) ++events;
      data_.clear();
      has_data_ = false;
    } else if (pending_.compare(0, 5, "data:") == 0) {
      size_t from = 5;
      if (pending_.size() > 5 && pending_[5] == ' ') from = 6;
      if (has_data_) data_ += '\n';
      data_.append(pending_, from, std::string::npos);
      has_data_ = true;
    }  // other fields (event:, id:, retry:) and comments (":") say nothing here
    pending_.clear();
  }
  return events;
}

bool OpenAiStreamReader::Event(const std::string& data) {
  if (data == "[DONE]") {
    done_ = true;
    return false;
  }
  const nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    if (error_.empty()) error_ = "an event that is not a JSON object: " + data.substr(0, 200);
    return false;
  }
  if (auto e = j.find("error"); e != j.end()) {
    if (error_.empty()) {
      const auto message = e->is_object() ? e->find("message") : e->end();
      error_ =
          message != e->end() && message->is_string() ? message->get<std::string>() : e->dump();
      if (error_.empty()) error_ = "an error event";
    }
    return false;
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    has_usage_ = true;
    prompt_tokens_ = IntegerAt(*u, "prompt_tokens");
    completion_tokens_ = IntegerAt(*u, "completion_tokens");
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      cached_tokens_ = IntegerAt(*d, "cached_tokens");
    }
  }
  bool output = false;
  auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array()) return false;
  for (const auto& c : *choices) {
    if (!c.is_object()) continue;
    const nlohmann::json* text = nullptr;
    if (auto t = c.find("text"); t != c.end()) {
      text = &*t;
    } else if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
      if (auto content = d->find("content"); content != d->end()) text = &*content;
    }
    if (text == nullptr || !text->is_string()) continue;
    const auto& s = text->get_ref<const std::string&>();
    if (s.empty()) continue;
    output = true;
    if (keep_text_) text_ += s;
  }
  if (output) ++token_events_;
  return output;
}

}  // namespace ferry
