// Fuzz target for the reply parsers: the text (after two bytes that pick the format, the options
// and how the text is cut into pieces) goes through the reasoning parser and then a tool-call
// parser, whole and in pieces. Never a crash, and the invariants the API relies on: the same
// content, reasoning, calls and arguments however the text is split; every call's first delta
// carries its id and name, later ones neither; deltas rebuild calls() exactly; no emitted piece
// ends inside a UTF-8 character (for valid UTF-8 input).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "router/api/reasoning_parser.h"
#include "router/api/tool_call_parser.h"

namespace {

struct Result {
  std::string reasoning, content;
  std::vector<ferry::ParsedToolCall> calls;  // rebuilt from the deltas
  std::vector<ferry::ParsedToolCall> parser_calls;
};

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void Absorb(const ferry::ParsedText& t, Result* r) {
  r->content += t.content;
  for (const ferry::ToolCallDelta& d : t.tool_calls) {
    if (d.index == static_cast<int>(r->calls.size())) {
      Check(!d.id.empty() && !d.name.empty());
      r->calls.push_back({d.id, d.name, "", false, false});
    } else {
      Check(d.index >= 0 && d.index < static_cast<int>(r->calls.size()));
      Check(d.id.empty() && d.name.empty());
    }
    r->calls[d.index].arguments += d.arguments;
  }
}

Result Run(ferry::ToolCallFormat format, bool first_only, bool started,
           const std::vector<std::string>& pieces) {
  ferry::ToolCallParserOptions options;
  if (first_only) options.functions = {"f", "g"};
  options.first_call_only = first_only;
  std::unique_ptr<ferry::ToolCallParser> tools = ferry::NewToolCallParser(format, options);
  ferry::ReasoningParser reasoning(started);
  Result r;
  for (size_t i = 0; i <= pieces.size(); ++i) {
    std::string think, content;
    if (i < pieces.size()) {
      reasoning.Feed(pieces[i], &think, &content);
    } else {
      reasoning.Finish(&think, &content);
    }
    r.reasoning += think;
    ferry::ParsedText t;
    tools->Feed(content, &t);
    if (i == pieces.size()) tools->Finish(&t);
    Absorb(t, &r);
  }
  r.parser_calls = tools->calls();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static constexpr ferry::ToolCallFormat kFormats[] = {
      ferry::ToolCallFormat::kHermes, ferry::ToolCallFormat::kLlama3Json,
      ferry::ToolCallFormat::kMistral, ferry::ToolCallFormat::kDeepSeek};
  const ferry::ToolCallFormat format = kFormats[data[0] % 4];
  const bool first_only = (data[0] & 4) != 0, started = (data[0] & 8) != 0;
  const size_t step = 1 + data[1] % 13;
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  std::vector<std::string> pieces;
  for (size_t at = 0; at < text.size(); at += step) pieces.push_back(text.substr(at, step));
  const Result whole = Run(format, first_only, started, {text});
  const Result split = Run(format, first_only, started, pieces);
  Check(whole.content == split.content && whole.reasoning == split.reasoning);
  Check(whole.calls.size() == split.calls.size());
  Check(split.calls.size() == split.parser_calls.size());
  for (size_t i = 0; i < split.calls.size(); ++i) {
    Check(whole.calls[i].name == split.calls[i].name);
    Check(whole.calls[i].arguments == split.calls[i].arguments);
    Check(split.calls[i].arguments == split.parser_calls[i].arguments);
    Check(whole.parser_calls[i].complete == split.parser_calls[i].complete);
  }
  return 0;
}
