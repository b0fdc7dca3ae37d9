// The OpenAI Responses API's answer (POST /v1/responses), written from the router's internal model
// (api_writer.h): the `response` object, as the openai SDK's `Response` type reads it, or its
// stream of typed server-sent events; and, when the request's `store` is true, the response kept
// in the ResponseStore for GET /v1/responses/{id} and previous_response_id.
//
// The response object: id, object "response", created_at, status ("completed", or "incomplete"
// with incomplete_details.reason "max_output_tokens" when the answer stopped at its length), error
// null, the request's settings echoed (instructions, max_output_tokens, model,
// parallel_tool_calls, previous_response_id, store, temperature, top_p, tool_choice, tools,
// metadata, user; reasoning {effort: null, summary: null}, text.format "text", truncation
// "disabled"), usage (input_tokens with cached_tokens, output_tokens with reasoning_tokens,
// total_tokens; cache_write_tokens 0: writes to the cache are not charged) and `output`:
//   a reasoning item {"type": "reasoning", "id": "rs_...", "summary": [], "content":
//     [{"type": "reasoning_text", "text"}]} when the model reasoned,
//   a message item {"type": "message", "id": "msg_...", "role": "assistant", "status", "content":
//     [{"type": "output_text", "text", "annotations": []}]} when it wrote text,
//   a function_call item {"type": "function_call", "id": "fc_...", "call_id", "name",
//     "arguments", "status"} per call.
// Item ids are the response id's suffix and the item's output index ("msg_<hex>_1"). The last item
// is "incomplete" when the response is.
//
// The stream ("event: <type>\ndata: <json>\n\n", every event with a sequence_number from 0):
// response.created and response.in_progress (the response in progress: output [], usage null);
// then per output item, in the order the model wrote them: response.output_item.added,
// response.content_part.added (reasoning and message items: an empty reasoning_text or
// output_text part), its deltas (response.reasoning_text.delta, response.output_text.delta,
// response.function_call_arguments.delta), and, when the next item starts or the answer ends,
// its done events (response.reasoning_text.done / response.output_text.done /
// response.function_call_arguments.done with the whole text, response.content_part.done,
// response.output_item.done with the complete item); last, response.completed (or
// response.incomplete) with the whole response, usage included. What StreamEnd's `choices` hold
// that the deltas did not bring (text, reasoning, calls) is streamed before the end, so the events
// always add up to the final response. A failure after the stream started: one `error` event
// {type, code, message, param, sequence_number} (the SDK's ResponseErrorEvent), then nothing.
//
// One choice: the Responses API has no `n` (the parser sets n = 1); choices other than 0 write
// nothing.
//
// Thread-compatible: one call's writer, used under that call's lock (api_writer.h).

#ifndef FERRY_ROUTER_API_RESPONSES_WRITER_H_
#define FERRY_ROUTER_API_RESPONSES_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "router/api/api_request.h"
#include "router/api/api_writer.h"
#include "router/api/conversation.h"
#include "router/api/response_store.h"

namespace ferry {

class ResponsesWriter final : public ApiWriter {
 public:
  // `id` is the response's ("resp_" + hex, made by the caller), `created_at` its unix seconds;
  // what the answer echoes is copied from `request`; `history` is the conversation from
  // ResponsesConversation (without the instructions). When `store` is not null and
  // request.store, the complete answer (Full or StreamEnd) is put in `store` under `tenant`, with
  // `history` and the answer as an assistant message as the conversation to continue. `store`
  // must outlive the writer.
  ResponsesWriter(std::string id, int64_t created_at, const ApiRequest& request,
                  std::vector<ApiMessage> history, ResponseStore* store, std::string tenant);

  std::string Full(const std::vector<ChoiceOutputs>& choices, const UsageCounts& usage) override;
  std::string StreamStart(int32_t choice) override;
  std::string StreamDelta(int32_t choice, const ChoiceOutputs& delta) override;
  std::string StreamEnd(const std::vector<ChoiceOutputs>& choices,
                        const UsageCounts& usage) override;
  std::string StreamError(const ApiError& error, const std::string& trace_id) override;

  // Whether the complete answer is in the store (false: `store` off or null, no complete answer
  // yet, or an entry larger than the store's byte bound).
  bool stored() const { return stored_; }

 private:
  enum class ItemKind { kReasoning, kMessage, kFunctionCall };
  struct Item {
    ItemKind kind = ItemKind::kMessage;
    std::string id;
    std::string text;  // the reasoning, the message's text, or the call's arguments
    std::string call_id;
    std::string name;
    int tool_index = -1;  // the ToolCallDelta index a streamed call came by (-1: none)
    std::string status;   // "" while open; "completed" or "incomplete"
  };

  nlohmann::ordered_json ItemJson(const Item& item) const;
  nlohmann::ordered_json ResponseJson(const std::string& status, const std::string& reason,
                                      const UsageCounts* usage) const;
  std::string Event(const char* type, nlohmann::ordered_json fields);
  // Streams `text` into the open item of `kind`, closing the open one and adding one first when
  // it is of another kind.
  void AppendText(ItemKind kind, const std::string& text, std::string* out);
  void AppendToolCall(const ToolCallDelta& delta, std::string* out);
  void Add(Item item, std::string* out);
  void CloseOpen(const std::string& status, std::string* out);
  void Finish(const ChoiceOutputs& choice, std::string* out);
  void Store(const std::string& response_json);

  const std::string id_;
  const std::string item_suffix_;  // the id without "resp_"
  const int64_t created_at_;
  const bool store_requested_;
  nlohmann::ordered_json echo_;  // the request's settings, in the response's field order
  std::vector<ApiMessage> history_;
  ResponseStore* const store_;
  const std::string tenant_;

  int64_t sequence_ = 0;
  std::vector<Item> items_;  // the output, by output index
  int open_ = -1;            // the streaming item's index (-1: none)
  bool started_ = false;
  bool ended_ = false;
  bool stored_ = false;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_RESPONSES_WRITER_H_
