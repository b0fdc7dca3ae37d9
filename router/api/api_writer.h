// What every API's response side implements (STYLE.md §15: an API is an adapter of the internal
// model): the router's answer (ChoiceOutputs, UsageCounts) written as that API's body, or as its
// stream of server-sent events. ApiCall owns one writer per call and calls it in this order:
//
//   non-streaming:  Full(choices, usage)                         -> the 200 body
//   streaming:      StreamStart(c) once per choice, before its first delta
//                   StreamDelta(c, delta) for what became final  (any number)
//                   StreamEnd(choices, usage)                    -> the closing events
//                or StreamError(error, trace_id)                 -> instead of StreamEnd
//
// Each Stream* call returns complete SSE events ("data: ...\n\n", or "event: x\ndata: ...\n\n"),
// possibly several, possibly none (""). A delta's fields are what became final since the last
// one: text (content), reasoning, tool-call pieces (a call's first piece has its id and name,
// later ones pieces of its arguments' JSON text), tokens and logprobs, and finish_reason when the
// choice ended (OpenAI's names: "stop", "length", "tool_calls"; the writer maps them to its API's).
// `choices` in Full and StreamEnd hold the whole answer of each choice (tool_calls complete).
//
// Writers may keep state across calls (content-block indexes, sequence numbers); one call's
// writer is used under that call's lock only. Thread-compatible.

#ifndef FERRY_ROUTER_API_API_WRITER_H_
#define FERRY_ROUTER_API_API_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "router/api/api_request.h"
#include "router/api/conversation.h"

namespace ferry {

class ApiWriter {
 public:
  virtual ~ApiWriter() = default;

  virtual std::string Full(const std::vector<ChoiceOutputs>& choices, const UsageCounts& usage) = 0;
  virtual std::string StreamStart(int32_t choice) = 0;
  virtual std::string StreamDelta(int32_t choice, const ChoiceOutputs& delta) = 0;
  virtual std::string StreamEnd(const std::vector<ChoiceOutputs>& choices,
                                const UsageCounts& usage) = 0;
  virtual std::string StreamError(const ApiError& error, const std::string& trace_id) = 0;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_API_WRITER_H_
