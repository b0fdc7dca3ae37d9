// Tool calls parsed out of a model's streamed text, whatever pieces the text arrives in.
//
// A parser is fed a choice's text as the detokenizer releases it (any split, even inside a marker
// or, defensively, inside a UTF-8 character) and returns what each piece adds: content (text that
// is not a tool call) and tool-call deltas in OpenAI's streaming shape: a call's first delta
// carries its index, id and name, later ones pieces of its arguments' JSON text. The same text
// split any other way yields the same content, the same calls and the same arguments once the
// pieces are concatenated; no emitted piece ends inside a UTF-8 character; nothing is emitted
// twice or dropped.
//
// Formats (what the model writes; the chat template of each renders calls the same way):
// - kHermes (Hermes, Qwen 2.5/3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, a
//   block per call, content around and between them (whitespace alone between or after calls is
//   formatting, not content).
// - kLlama3Json (Llama 3.1-3.3): the whole reply is `{"name": ..., "parameters": {...}}`, maybe
//   after `<|python_tag|>`, several calls separated by `;`. A reply that does not begin with a
//   call is all content.
// - kMistral (v0.3 templates): `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`, content
//   before the marker.
// - kDeepSeek (V3 / R1): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//   \n```json\nARGS\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`; V3.1's
//   `<｜tool▁call▁begin｜>NAME <｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` too.
// The JSON formats' objects are scanned as they arrive: the name is emitted once its string has
// ended, the arguments as their bytes arrive (after the name, when the model wrote them first),
// so a marker inside an argument string does not end the call. DeepSeek's arguments that begin
// with '{' are scanned the same way and end with their object (a fence or marker inside one of
// their strings is text); other arguments end at the fence or the call's end marker.
// "arguments" and "parameters" are both accepted as the arguments' key.
//
// What a model does wrong is never a crash and never a tool call that was not one:
// - a call whose name is not a known function (when functions are given), or whose JSON ends or
//   breaks before a name, is content, as the model wrote it (markers included);
// - arguments given as a JSON string (stringified JSON) are emitted decoded, in one piece when the
//   string ends;
// - a call the text ends inside (max_tokens) stays in calls() with complete == false, and
//   arguments_valid tells whether its arguments parse as a JSON object: the caller picks the
//   finish_reason;
// - with first_call_only (parallel_tool_calls: false), everything after the first call ends is
//   dropped.
//
// Thread-compatible: one parser per choice.

#ifndef FERRY_ROUTER_API_TOOL_CALL_PARSER_H_
#define FERRY_ROUTER_API_TOOL_CALL_PARSER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "router/api/conversation.h"  // ToolCallDelta

namespace ferry {

enum class ToolCallFormat { kHermes, kLlama3Json, kMistral, kDeepSeek };

// "hermes", "llama3_json", "mistral", "deepseek".
const char* ToolCallFormatName(ToolCallFormat format);
std::optional<ToolCallFormat> ToolCallFormatFromName(absl::string_view name);
// The format a chat template renders tool calls in, from the markers in its source; nullopt when
// it has none (the template cannot show a model its tools).
std::optional<ToolCallFormat> DetectToolCallFormat(absl::string_view template_source);
// The markers a format's parser reads (a tokenizer may have them as special tokens, which the
// worker must then keep in the text).
std::vector<std::string> ToolCallMarkers(ToolCallFormat format);

// What one Feed or Finish added.
struct ParsedText {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && tool_calls.empty(); }
};

// A call as parsed so far (every delta of it, joined).
struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;
  bool complete = false;         // its block ended
  bool arguments_valid = false;  // arguments parse as a JSON object (set once complete)
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  // Appends to `out` what `text` adds.
  virtual void Feed(absl::string_view text, ParsedText* out) = 0;
  // The text ended: appends what was held back (a possible marker's start, a call with no name
  // yet) as content.
  virtual void Finish(ParsedText* out) = 0;
  // Every call that has begun (its name was emitted), in order.
  virtual const std::vector<ParsedToolCall>& calls() const = 0;
};

struct ToolCallParserOptions {
  // The names a call may have (empty: any).
  std::vector<std::string> functions;
  // The id of the call at an index; unset: "call_<index>". Give each request ids of its own.
  std::function<std::string(int)> call_id;
  // parallel_tool_calls: false. Only the first call is kept; what follows it is dropped.
  bool first_call_only = false;
};

std::unique_ptr<ToolCallParser> NewToolCallParser(ToolCallFormat format,
                                                  ToolCallParserOptions options);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_TOOL_CALL_PARSER_H_
