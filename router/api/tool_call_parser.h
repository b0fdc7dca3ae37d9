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
// Formats: Hermes / Qwen (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block
// per call, several blocks for parallel calls). The call's JSON is scanned as it arrives: the name
// is emitted once its string has ended, the arguments as their bytes arrive (after the name, when
// the model wrote them first), so a marker inside an argument string does not end the call. The
// arguments' key may also be "parameters" (Llama 3.x's JSON calls use that name).
//
// What a model does wrong is never a crash and never a tool call that was not one:
// - a call whose name is not a known function (when functions are given), or whose JSON ends or
//   breaks before a name, is content, byte for byte as the model wrote it (marker included);
// - arguments given as a JSON string (stringified JSON) are emitted decoded, in one piece when the
//   string ends;
// - a call the text ends inside (max_tokens) stays in calls() with complete == false, and
//   arguments_valid tells whether its arguments parse as a JSON object: the caller picks the
//   finish_reason.
//
// Thread-compatible: one parser per choice.

#ifndef FERRY_ROUTER_API_TOOL_CALL_PARSER_H_
#define FERRY_ROUTER_API_TOOL_CALL_PARSER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ferry {

// One piece of a streamed tool call.
struct ToolCallDelta {
  int index = 0;          // the call's position among this choice's calls
  std::string id;         // the call's first delta only
  std::string name;       // the call's first delta only
  std::string arguments;  // a piece of the arguments' JSON text (may be empty)
};

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

// `functions`: the names a call may have (empty: any). Call ids are `id_prefix` followed by the
// call's index (give each request a prefix of its own, e.g. "call_<request id>_<choice>_").
std::unique_ptr<ToolCallParser> NewHermesToolCallParser(std::vector<std::string> functions,
                                                        std::string id_prefix);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_TOOL_CALL_PARSER_H_
