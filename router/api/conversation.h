// The router's one model of a conversation and its answer (STYLE.md §15): every API adapter
// converts its request into these types and its response out of them, so that the prompt
// builder, the tool-call and reasoning parsers and the dispatcher know no API. The OpenAI chat
// and completions adapters are openai_parser.h (requests) and openai_writer.h (responses).
//
// Plain values; thread-compatible.

#ifndef FERRY_ROUTER_API_CONVERSATION_H_
#define FERRY_ROUTER_API_CONVERSATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/token_id.h"
#include "nlohmann/json.hpp"

namespace ferry {

enum class ApiRole { kSystem, kUser, kAssistant, kTool };

// A call the assistant made: `arguments` is its JSON text (an object when the model got it right).
struct ApiToolCall {
  std::string id;
  std::string name;
  std::string arguments;
};

// An image a client sent: its encoded bytes (decoded from a data: URL or base64) and their media
// type, or a remote http(s) URL not fetched yet (bytes empty until the router fetches it).
struct ApiImage {
  std::string bytes;
  std::string media_type;  // "image/png"... as the client said (the bytes' header decides)
  std::string url;         // a remote image: its http(s) URL; "" for inline bytes
  std::string param;       // where the request holds it ("messages[0].content[1]"), for errors
};

// One part of a message's content: text, or an image (in the conversation's order).
struct ApiContentPart {
  std::string text;
  std::optional<ApiImage> image;
};

struct ApiMessage {
  ApiRole role = ApiRole::kUser;
  std::vector<ApiContentPart> content;
  std::string name;                     // a participant's name, when given
  std::string reasoning;                // assistant: its reasoning (reasoning_content)
  std::vector<ApiToolCall> tool_calls;  // assistant
  std::string tool_call_id;             // tool: the call this result answers

  std::string Text() const {
    std::string out;
    for (const ApiContentPart& p : content) out += p.text;
    return out;
  }
  bool HasImages() const {
    for (const ApiContentPart& p : content) {
      if (p.image.has_value()) return true;
    }
    return false;
  }
};

// A function the model may call: its JSON-schema parameters as the client wrote them (key order
// kept: templates print them).
struct ApiTool {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();
  std::optional<bool> strict;
};

struct ApiToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction: the one the model must call
};

struct TokenLogprob {
  TokenId token = 0;
  float logprob = 0;
  std::vector<std::pair<TokenId, float>> top;
};

// One piece of a streamed tool call: a call's first piece carries its index, id and name, later
// ones pieces of its arguments' JSON text.
struct ToolCallDelta {
  int index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

// One choice's answer so far (or in full), or what one stream event adds to it.
struct ChoiceOutputs {
  std::string text;                     // content (completions: the text)
  std::string reasoning;                // reasoning models' thinking, apart from the content
  std::vector<ApiToolCall> tool_calls;  // whole answers
  std::vector<ToolCallDelta> tool_call_deltas;  // stream events
  std::vector<TokenId> tokens;
  std::vector<TokenLogprob> logprobs;  // one per token when asked
  std::string finish_reason;           // "stop", "length", "tool_calls"... ("" while running)
  std::string matched_stop;  // the stop string that ended the choice ("" if none or a token)
};

struct UsageCounts {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  // Of the prompt tokens (proto CachedTokens): of cached_tokens, those read from the KV store (the
  // rest came from the prefill or aggregated worker's memory); and, not part of cached_tokens,
  // those a decode worker already held.
  int64_t store_tokens = 0;
  int64_t decode_local_tokens = 0;
  int64_t reasoning_tokens = 0;  // of completion_tokens, those the reasoning took
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_CONVERSATION_H_
