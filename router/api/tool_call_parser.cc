#include "router/api/tool_call_parser.h"

#include <utility>

#include "absl/strings/match.h"
#include "nlohmann/json.hpp"
#include "router/api/tool_call_parser_internal.h"

namespace ferry {
namespace tool_call_internal {

bool DecodeJsonString(absl::string_view literal, std::string* out) {
  nlohmann::json j = nlohmann::json::parse(literal.begin(), literal.end(), nullptr, false);
  if (!j.is_string()) return false;
  *out = j.get<std::string>();
  return true;
}

bool IsJsonObject(absl::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  return j.is_object();
}

}  // namespace tool_call_internal

using tool_call_internal::JsonFraming;
using tool_call_internal::kDsCallBegin;
using tool_call_internal::kDsCallEnd;
using tool_call_internal::kDsCallsBegin;
using tool_call_internal::kDsCallsEnd;
using tool_call_internal::kDsSep;
using tool_call_internal::NewDeepSeekToolCallParser;
using tool_call_internal::NewJsonToolCallParser;

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kDeepSeek:
      return "deepseek";
  }
  return "";
}

std::optional<ToolCallFormat> ToolCallFormatFromName(absl::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                           ToolCallFormat::kMistral, ToolCallFormat::kDeepSeek}) {
    if (name == ToolCallFormatName(f)) return f;
  }
  return std::nullopt;
}

std::optional<ToolCallFormat> DetectToolCallFormat(absl::string_view source) {
  if (absl::StrContains(source, "<tool_call>")) return ToolCallFormat::kHermes;
  if (absl::StrContains(source, "[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  if (absl::StrContains(source, kDsCallBegin)) return ToolCallFormat::kDeepSeek;
  if (absl::StrContains(source, "<|python_tag|>") ||
      (absl::StrContains(source, "\"parameters\"") && absl::StrContains(source, "ipython"))) {
    return ToolCallFormat::kLlama3Json;
  }
  return std::nullopt;
}

std::vector<std::string> ToolCallMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::kLlama3Json:
      return {"<|python_tag|>"};
    case ToolCallFormat::kMistral:
      return {"[TOOL_CALLS]"};
    case ToolCallFormat::kDeepSeek:
      return {std::string(kDsCallsBegin), std::string(kDsCallsEnd), std::string(kDsCallBegin),
              std::string(kDsCallEnd), std::string(kDsSep)};
  }
  return {};
}

std::unique_ptr<ToolCallParser> NewToolCallParser(ToolCallFormat format,
                                                  ToolCallParserOptions options) {
  JsonFraming framing;
  switch (format) {
    case ToolCallFormat::kHermes:
      framing.open = "<tool_call>";
      framing.close = "</tool_call>";
      break;
    case ToolCallFormat::kLlama3Json:
      framing.open = "<|python_tag|>";
      framing.at_start_only = true;
      framing.separator = ';';
      break;
    case ToolCallFormat::kMistral:
      framing.open = "[TOOL_CALLS]";
      framing.list = true;
      framing.separator = ',';
      break;
    case ToolCallFormat::kDeepSeek:
      return NewDeepSeekToolCallParser(std::move(options));
  }
  return NewJsonToolCallParser(std::move(framing), std::move(options));
}

}  // namespace ferry
