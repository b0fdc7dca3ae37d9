#include "router/api/reasoning_parser.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace ferry {
namespace {

// The longest prefix of `s` that does not end inside a UTF-8 character.
size_t Utf8SafeLength(absl::string_view s) {
  size_t start = s.size();
  for (int back = 0; back < 4 && start > 0; ++back) {
    --start;
    const auto c = static_cast<unsigned char>(s[start]);
    if ((c & 0xC0) != 0x80) {
      const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      return s.size() - start >= need ? s.size() : start;
    }
  }
  return s.size();
}

size_t MarkerPrefixAtEnd(absl::string_view s, absl::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

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
