// A reasoning model's thinking split from its answer, whatever pieces the text arrives in:
// `<think>...</think>` at the start of a reply (after whitespace) is reasoning, the rest content.
// When the prompt already opened the block (DeepSeek-R1's template ends its generation prompt with
// "<think>\n"), the reply starts inside it. The newlines a model writes between `</think>` and its
// answer belong to neither. A reply cut inside the block (max_tokens) is all reasoning; a reply
// that does not begin with the block is all content (a `<think>` later in it stays text).
//
// Like the tool-call parsers (tool_call_parser.h): the same text split any other way yields the
// same reasoning and content, no piece ends inside a UTF-8 character, nothing is dropped but the
// markers and those newlines.
//
// Thread-compatible: one parser per choice.

#ifndef FERRY_ROUTER_API_REASONING_PARSER_H_
#define FERRY_ROUTER_API_REASONING_PARSER_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

class ReasoningParser {
 public:
  // `started`: the prompt ends inside an open block.
  explicit ReasoningParser(bool started = false) : mode_(started ? kInside : kStart) {}

  // Appends what `text` adds to `reasoning` and `content`.
  void Feed(absl::string_view text, std::string* reasoning, std::string* content);
  // The text ended: what was held back.
  void Finish(std::string* reasoning, std::string* content);
  // Whether the text so far may still be reasoning (the block is open, or may open).
  bool reasoning() const { return mode_ == kStart || mode_ == kInside; }

  static constexpr absl::string_view kOpen = "<think>";
  static constexpr absl::string_view kClose = "</think>";
  // Whether a rendered prompt ends inside an open block (with its open marker, and whitespace).
  static bool PromptOpensBlock(absl::string_view prompt);

 private:
  enum Mode { kStart, kInside, kAfter, kContent };
  void Run(bool final, std::string* reasoning, std::string* content);

  Mode mode_;
  std::string input_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_API_REASONING_PARSER_H_
