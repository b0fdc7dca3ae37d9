#include "router/api/reasoning_parser.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "router/api/streamed_text.h"

namespace ferry {

bool ReasoningParser::PromptOpensBlock(absl::string_view prompt) {
  const size_t open = prompt.rfind(kOpen);
  if (open == absl::string_view::npos) return false;
  return prompt.find_first_not_of(" \t\r\n", open + kOpen.size()) == absl::string_view::npos;
}

void ReasoningParser::Feed(absl::string_view text, std::string* reasoning, std::string* content) {
  input_.append(text.data(), text.size());
  Run(/*final=*/false, reasoning, content);
}

void ReasoningParser::Finish(std::string* reasoning, std::string* content) {
  Run(/*final=*/true, reasoning, content);
  input_.clear();
}

void ReasoningParser::Run(bool final, std::string* reasoning, std::string* content) {
  while (true) {
    switch (mode_) {
      case kStart: {
        const size_t first = input_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) {
          if (!final) return;
          mode_ = kContent;
          break;
        }
        const absl::string_view rest = absl::string_view(input_).substr(first);
        if (absl::StartsWith(rest, kOpen)) {
          input_.erase(0, first + kOpen.size());
          mode_ = kInside;
          break;
        }
        if (!final && rest.size() < kOpen.size() && kOpen.substr(0, rest.size()) == rest) return;
        mode_ = kContent;
        break;
      }
      case kInside: {
        const size_t close = input_.find(kClose.data(), 0, kClose.size());
        if (close != std::string::npos) {
          reasoning->append(input_, 0, close);
          input_.erase(0, close + kClose.size());
          mode_ = kAfter;
          break;
        }
        size_t emit = input_.size();
        if (!final) {
          emit -= MarkerPrefixAtEnd(input_, kClose);
          emit = Utf8SafeLength(absl::string_view(input_).substr(0, emit));
        }
        reasoning->append(input_, 0, emit);
        input_.erase(0, emit);
        return;
      }
      case kAfter: {
        const size_t first = input_.find_first_not_of("\r\n");
        input_.erase(0, first == std::string::npos ? input_.size() : first);
        if (input_.empty()) {
          if (final) mode_ = kContent;
          return;
        }
        mode_ = kContent;
        break;
      }
      case kContent: {
        const size_t emit = final ? input_.size() : Utf8SafeLength(absl::string_view(input_));
        content->append(input_, 0, emit);
        input_.erase(0, emit);
        return;
      }
    }
  }
}

}  // namespace ferry
