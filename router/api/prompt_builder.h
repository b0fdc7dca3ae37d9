// The prompt of an API request as token ids (ARCHITECTURE.md §3 step 1): chat messages rendered
// with the model's own chat template and tokenized with user text kept as text (a special-token
// string inside a message never becomes a control token: PromptSegments); completions' text
// tokenized as plain text, or their token ids taken as they are. Then the lengths are checked:
// the prompt must leave room in the model's context for the tokens asked for.
//
// Thread-safe (immutable after construction).

#ifndef FERRY_ROUTER_API_PROMPT_BUILDER_H_
#define FERRY_ROUTER_API_PROMPT_BUILDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "router/api/api_request.h"

namespace ferry {

struct BuiltPrompt {
  std::vector<TokenId> tokens;
  int64_t max_tokens = 0;  // what the request may generate (asked, or what the context leaves)
};

class PromptBuilder {
 public:
  // `chat_template` may be null (then chat requests are refused). Both must outlive the builder.
  PromptBuilder(const Tokenizer* tokenizer, const ChatTemplate* chat_template);

  // `context` is the model's positions. Errors: 400 with `param` (messages, prompt, max_tokens)
  // and code context_length_exceeded where the lengths do not fit.
  ApiError Build(const ApiRequest& request, int64_t context, BuiltPrompt* out) const;

  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  const Tokenizer* const tokenizer_;
  const ChatTemplate* const chat_template_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_PROMPT_BUILDER_H_
