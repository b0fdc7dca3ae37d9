// The client's side of an OpenAI streaming answer (`text/event-stream`, /v1/completions or
// /v1/chat/completions with stream: true): the SSE framing (events of "data: ..." lines ended by
// a blank line, "\n" or "\r\n") and what each event says: whether it carries output (a choice's
// non-empty `text` or `delta.content`: the load tool's token events, for TTFT and ITL), the usage
// of the final chunk (stream_options.include_usage), an error event, or "[DONE]". Events with
// nothing but a role or a finish_reason carry no output.
//
// Thread-compatible: one per stream.

#ifndef FERRY_TOOLS_LOAD_OPENAI_STREAM_H_
#define FERRY_TOOLS_LOAD_OPENAI_STREAM_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

class OpenAiStreamReader {
 public:
  // `keep_text`: accumulate the output text (the chat sessions resend it).
  explicit OpenAiStreamReader(bool keep_text = false) : keep_text_(keep_text) {}

  // Reads the next bytes of the body; returns how many events among the ones they completed
  // carried output.
  int Feed(absl::string_view bytes);

  bool done() const { return done_; }  // "[DONE]" was read
  bool has_usage() const { return has_usage_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  int64_t completion_tokens() const { return completion_tokens_; }
  int64_t cached_tokens() const { return cached_tokens_; }
  int64_t token_events() const { return token_events_; }
  const std::string& text() const { return text_; }
  // The first error event's message, or an event that is not JSON; empty when none.
  const std::string& error() const { return error_; }

 private:
  // One event's data (its "data:" lines joined by "\n"); returns whether it carried output.
  bool Event(const std::string& data);

  const bool keep_text_;
  std::string pending_;  // bytes of a line not yet ended
  std::string data_;     // the current event's data so far
  bool has_data_ = false;
  bool done_ = false;
  bool has_usage_ = false;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0, cached_tokens_ = 0;
  int64_t token_events_ = 0;
  std::string text_;
  std::string error_;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_OPENAI_STREAM_H_
