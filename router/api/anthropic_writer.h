// The Anthropic Messages API's answers, field for field as the anthropic SDK's types have them
// (Message, RawMessageStreamEvent, ErrorResponse): a message body {"id", "type": "message",
// "role", "model", "content", "stop_reason", "stop_sequence", "usage"}, its stream of server-sent
// events (message_start, ping, content_block_start / _delta / _stop, message_delta,
// message_stop), and error bodies and statuses.
//
// Content blocks, in order: a thinking block for the model's reasoning (signature "": Ferry signs
// nothing, and its parser takes the block back as the assistant's reasoning), text, then one
// tool_use block per call, its `input` the call's arguments parsed as a JSON object. A call whose
// arguments are not a JSON object (a model's mistake, or a call cut off by max_tokens) gets
// `input` {} in a full body, and its text is not kept anywhere; in a stream its argument pieces
// went out as input_json_delta events as the model wrote them. A stream opens a block when its
// kind of output starts (reasoning, text, a new call) and closes the open one then and at the end,
// so blocks never interleave; within one delta, reasoning goes first, then text, then tool calls.
//
// Finish reasons: "stop" -> end_turn, or stop_sequence (with stop_sequence, the string that
// matched) when a stop string ended it; "length" -> max_tokens; "tool_calls" -> tool_use; anything
// else (abort, error) -> end_turn.
//
// Usage: input_tokens = prompt tokens not read from a cache, cache_read_input_tokens = cached
// prompt tokens, cache_creation_input_tokens = 0 (Ferry writes every full block of every prompt
// to its caches anyway and charges no write premium, so no tokens are billed as cache writes),
// output_tokens = completion tokens (output_tokens_details.thinking_tokens: those the reasoning
// took, when any). input + cache_read + cache_creation = the prompt's tokens. message_start
// carries the prompt's token count as input_tokens (what is cached is known at the end);
// message_delta carries the final counts, which the SDK takes over.
//
// Messages have one answer: only choice 0 is written (StreamStart and StreamDelta of any other
// choice return "", and Full and StreamEnd read choices[0]).
//
// Thread-compatible: a writer per call, used under that call's lock (api_writer.h).

#ifndef FERRY_ROUTER_API_ANTHROPIC_WRITER_H_
#define FERRY_ROUTER_API_ANTHROPIC_WRITER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "router/api/api_request.h"
#include "router/api/api_writer.h"
#include "router/api/conversation.h"

namespace ferry {

class AnthropicWriter final : public ApiWriter {
 public:
  // `id`: the message's id ("msg_" and random hex, made by the caller); `model`: the request's
  // model string; `prompt_tokens`: the prompt's length (message_start's usage.input_tokens).
  AnthropicWriter(std::string id, std::string model, int64_t prompt_tokens);

  std::string Full(const std::vector<ChoiceOutputs>& choices, const UsageCounts& usage) override;
  // message_start and a ping.
  std::string StreamStart(int32_t choice) override;
  // Blocks opened, extended and closed for what `delta` adds (its finish_reason waits for
  // StreamEnd).
  std::string StreamDelta(int32_t choice, const ChoiceOutputs& delta) override;
  // The open block's content_block_stop, message_delta (stop reason, final usage), message_stop.
  std::string StreamEnd(const std::vector<ChoiceOutputs>& choices,
                        const UsageCounts& usage) override;
  // An `error` event holding AnthropicErrorBody's JSON.
  std::string StreamError(const ApiError& error, const std::string& trace_id) override;

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };

  // content_block_start of a new block of `kind` (the open one closed first).
  std::string Open(Block kind, nlohmann::ordered_json content_block);
  // The open block's content_block_stop (a thinking block's signature_delta first), or "".
  std::string Close();

  const std::string id_;
  const std::string model_;
  const int64_t prompt_tokens_;
  bool started_ = false;  // message_start sent
  Block open_ = Block::kNone;
  int32_t open_index_ = -1;
  int32_t next_index_ = 0;
  std::map<int, int32_t> call_blocks_;  // a tool call's index -> its block's index
};

// The HTTP status Ferry answers an Anthropic client with for `code`: HttpStatusCode's, except
// that 503 (overloaded, no capacity) is Anthropic's 529.
int AnthropicHttpStatus(absl::StatusCode code);

// Anthropic's error type for an HTTP status: 400 invalid_request_error, 401 authentication_error,
// 402 billing_error, 403 permission_error, 404 not_found_error, 413 request_too_large,
// 429 rate_limit_error, 504 timeout_error, 529 overloaded_error, and api_error for 500 and any
// other.
absl::string_view AnthropicErrorType(int http_status);

// {"type":"error","error":{"type":...,"message":...},"request_id":<trace_id, or null if empty>}
// as compact JSON (invalid UTF-8 in the message replaced).
std::string AnthropicErrorBody(const absl::Status& status, absl::string_view trace_id);

}  // namespace ferry

#endif  // FERRY_ROUTER_API_ANTHROPIC_WRITER_H_
