// What the tool-call parsers (tool_call_parser.h) share, declared for the files that define them
// by format: tool_call_parser_json.cc (the JSON call objects of Hermes / Qwen, Llama 3 JSON and
// Mistral, one scanner told apart by JsonFraming) and tool_call_parser_deepseek.cc (DeepSeek's
// markers and fenced arguments). tool_call_parser.cc holds the format names, detection and markers,
// NewToolCallParser's dispatch by format, and the JSON helpers below.
//
// Internal to the tool_call_parser library. A parser owns its input and calls; like
// ToolCallParser, thread-compatible (one per choice). Nothing here fails: text that is not a call
// is content (see tool_call_parser.h).

#ifndef FERRY_ROUTER_API_TOOL_CALL_PARSER_INTERNAL_H_
#define FERRY_ROUTER_API_TOOL_CALL_PARSER_INTERNAL_H_

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "router/api/streamed_text.h"
#include "router/api/tool_call_parser.h"

// Hidden visibility: nothing here is used outside the tool_call_parser library (as when all of
// it was one file, with internal linkage).
#pragma GCC visibility push(hidden)

namespace ferry {
namespace tool_call_internal {

inline bool IsSpace(char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); }

// A JSON string literal (quotes included) decoded; false when it is not one.
bool DecodeJsonString(absl::string_view literal, std::string* out);
// Whether `text` parses as a JSON object.
bool IsJsonObject(absl::string_view text);

// What every format shares: the input not yet consumed, the calls, and how deltas are made.
class ParserBase : public ToolCallParser {
 public:
  explicit ParserBase(ToolCallParserOptions options) : options_(std::move(options)) {}

  void Feed(absl::string_view text, ParsedText* out) override {
    if (dropping_) return;
    input_.append(text.data(), text.size());
    Run(out, /*final=*/false);
    if (dropping_) input_.clear();
  }

  void Finish(ParsedText* out) override {
    if (dropping_) return;
    Run(out, /*final=*/true);
    input_.clear();
  }

  const std::vector<ParsedToolCall>& calls() const override { return calls_; }

 protected:
  // Consumes as much of input_ as the format allows (all of it once `final`).
  virtual void Run(ParsedText* out, bool final) = 0;

  bool Known(const std::string& name) const {
    return options_.functions.empty() ||
           std::find(options_.functions.begin(), options_.functions.end(), name) !=
               options_.functions.end();
  }

  // A call named `name` begins: its first delta.
  void Begin(const std::string& name, ParsedText* out) {
    const int index = static_cast<int>(calls_.size());
    ParsedToolCall call;
    call.id = options_.call_id ? options_.call_id(index) : absl::StrCat("call_", index);
    call.name = name;
    ToolCallDelta delta;
    delta.index = index;
    delta.id = call.id;
    delta.name = call.name;
    calls_.push_back(std::move(call));
    out->tool_calls.push_back(std::move(delta));
  }

  // More of the current call's arguments (joined to this output's last delta of that call).
  void Arguments(ParsedText* out, absl::string_view piece) {
    if (piece.empty()) return;
    calls_.back().arguments.append(piece.data(), piece.size());
    if (!out->tool_calls.empty() &&
        out->tool_calls.back().index == static_cast<int>(calls_.size()) - 1) {
      out->tool_calls.back().arguments.append(piece.data(), piece.size());
      return;
    }
    ToolCallDelta delta;
    delta.index = static_cast<int>(calls_.size()) - 1;
    delta.arguments = std::string(piece);
    out->tool_calls.push_back(std::move(delta));
  }

  // The current call ended (its closing marker or its object's end).
  void Complete() {
    ParsedToolCall& call = calls_.back();
    call.complete = true;
    call.arguments_valid = IsJsonObject(call.arguments);
    if (options_.first_call_only) dropping_ = true;
  }

  // Moves input_ to content but for what may still begin one of `markers` or ends inside a
  // character (everything once `final`).
  void ReleaseContent(std::initializer_list<absl::string_view> markers, bool final,
                      ParsedText* out) {
    size_t emit = input_.size();
    if (!final) {
      size_t hold = 0;
      for (absl::string_view m : markers) hold = std::max(hold, MarkerPrefixAtEnd(input_, m));
      emit -= hold;
      emit = Utf8SafeLength(absl::string_view(input_).substr(0, emit));
    }
    out->content.append(input_, 0, emit);
    input_.erase(0, emit);
  }

  // The earliest of `markers` in input_: its position (npos if none) and which one.
  size_t FindFirst(std::initializer_list<absl::string_view> markers, absl::string_view* which) {
    size_t best = std::string::npos;
    for (absl::string_view m : markers) {
      const size_t at = input_.find(m.data(), 0, m.size());
      if (at < best) {
        best = at;
        *which = m;
      }
    }
    return best;
  }

  const ToolCallParserOptions options_;
  std::vector<ParsedToolCall> calls_;
  std::string input_;  // fed text not yet consumed
  bool dropping_ = false;
};

// Hermes, Llama 3 JSON and Mistral: JSON call objects, framed by markers.
struct JsonFraming {
  std::string open;            // the marker before a call or a group of calls
  std::string close;           // the marker after each call ("" for none)
  bool at_start_only = false;  // calls only at the reply's start (the open marker optional)
  bool list = false;           // the group may be a JSON array of calls
  char separator = 0;          // between the calls of a group (0: none)
};

// tool_call_parser_json.cc.
std::unique_ptr<ToolCallParser> NewJsonToolCallParser(JsonFraming framing,
                                                      ToolCallParserOptions options);

// DeepSeek's markers (V3 / R1, and V3.1's shorter call head): what its parser reads, and what
// DetectToolCallFormat and ToolCallMarkers name.
constexpr absl::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr absl::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr absl::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr absl::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr absl::string_view kDsSep = "<｜tool▁sep｜>";

// tool_call_parser_deepseek.cc.
std::unique_ptr<ToolCallParser> NewDeepSeekToolCallParser(ToolCallParserOptions options);

}  // namespace tool_call_internal
}  // namespace ferry

#pragma GCC visibility pop

#endif  // FERRY_ROUTER_API_TOOL_CALL_PARSER_INTERNAL_H_
