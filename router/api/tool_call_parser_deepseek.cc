// DeepSeek V3 / R1 tool calls, and V3.1's shorter call head (tool_call_parser.h).

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "router/api/streamed_text.h"
#include "router/api/tool_call_parser_internal.h"

namespace ferry {
namespace tool_call_internal {
namespace {

constexpr absl::string_view kFence = "```";
constexpr size_t kMaxDsHead = 256;  // a call's type and name longer than this is not a call

class DeepSeekToolCallParser : public ParserBase {
 public:
  using ParserBase::ParserBase;

 private:
  enum class Mode {
    kText,       // content
    kCalls,      // between calls: a call's begin marker or the end of the calls
    kHead,       // up to the separator: "function" (V3) or the name (V3.1)
    kName,       // V3: the name, up to the end of its line
    kFenceOpen,  // V3: "```json" before the arguments
    kArgs,       // the arguments, up to "```" or the call's end marker
    kAfterArgs,  // after the closing fence: the call's end marker
    kRawCall,    // not a call: content through the call's end marker
  };

  void Run(ParsedText* out, bool final) override {
    bool progress = true;
    while (progress && !dropping_) {
      switch (mode_) {
        case Mode::kText:
          progress = RunText(out, final);
          break;
        case Mode::kCalls:
          progress = RunCalls(final);
          break;
        case Mode::kHead:
          progress = RunHead(out, final);
          break;
        case Mode::kName:
          progress = RunName(out, final);
          break;
        case Mode::kFenceOpen:
          progress = RunFenceOpen(final);
          break;
        case Mode::kArgs:
          progress = RunArgs(out, final);
          break;
        case Mode::kAfterArgs:
          progress = RunAfterArgs(final);
          break;
        case Mode::kRawCall:
          progress = RunRaw(out, final);
          break;
      }
    }
  }

  bool RunText(ParsedText* out, bool final) {
    absl::string_view which;
    const size_t at = FindFirst({kDsCallsBegin, kDsCallBegin}, &which);
    if (at == std::string::npos) {
      ReleaseContent({kDsCallsBegin, kDsCallBegin}, final, out);
      return false;
    }
    out->content.append(input_, 0, at);
    input_.erase(0, which == kDsCallsBegin ? at + which.size() : at);
    mode_ = Mode::kCalls;
    return true;
  }

  bool RunCalls(bool final) {
    const size_t first = input_.find_first_not_of(" \t\r\n");
    const absl::string_view rest =
        first == std::string::npos ? absl::string_view() : absl::string_view(input_).substr(first);
    if (absl::StartsWith(rest, kDsCallBegin)) {
      input_.erase(0, first + kDsCallBegin.size());
      call_text_ = std::string(kDsCallBegin);
      mode_ = Mode::kHead;
      return true;
    }
    if (absl::StartsWith(rest, kDsCallsEnd)) {
      input_.erase(0, first + kDsCallsEnd.size());
      mode_ = Mode::kText;
      return true;
    }
    if (!final && (CouldBegin(rest, kDsCallBegin) || CouldBegin(rest, kDsCallsEnd))) return false;
    mode_ = Mode::kText;  // anything else: text again
    return true;
  }

  bool RunHead(ParsedText* out, bool final) {
    const size_t sep = input_.find(kDsSep.data(), 0, kDsSep.size());
    if (sep == std::string::npos || sep > kMaxDsHead) {
      if (!final && input_.size() <= kMaxDsHead + kDsSep.size()) return false;
      return ToRaw(out);
    }
    const std::string head(absl::StripAsciiWhitespace(absl::string_view(input_).substr(0, sep)));
    call_text_.append(input_, 0, sep + kDsSep.size());
    input_.erase(0, sep + kDsSep.size());
    if (head == "function") {
      mode_ = Mode::kName;
      return true;
    }
    return BeginCall(head, Mode::kArgs, out);
  }

  bool RunName(ParsedText* out, bool final) {
    const size_t end = input_.find_first_of("\n`<");
    if (end == std::string::npos || end > kMaxDsHead) {
      if (!final && input_.size() <= kMaxDsHead) return false;
      return ToRaw(out);
    }
    const std::string name(absl::StripAsciiWhitespace(absl::string_view(input_).substr(0, end)));
    call_text_.append(input_, 0, end);
    input_.erase(0, end);
    return BeginCall(name, Mode::kFenceOpen, out);
  }

  bool BeginCall(const std::string& name, Mode next, ParsedText* out) {
    if (name.empty() || !Known(name)) return ToRaw(out);
    Begin(name, out);
    args_begun_ = false;
    mode_ = next;
    return true;
  }

  bool RunFenceOpen(bool final) {
    const size_t first = input_.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) {
      if (!final) return false;
      input_.clear();
      mode_ = Mode::kArgs;
      return true;
    }
    const absl::string_view rest = absl::string_view(input_).substr(first);
    constexpr absl::string_view kJsonFence = "```json";
    if (!final && CouldBegin(rest, kJsonFence)) return false;
    const size_t fence = absl::StartsWith(rest, kJsonFence) ? kJsonFence.size()
                         : absl::StartsWith(rest, kFence)   ? kFence.size()
                                                            : 0;
    input_.erase(0, first + fence);
    mode_ = Mode::kArgs;  // no fence: the arguments right away
    return true;
  }

  // Arguments up to the closing fence or the call's end; leading and trailing whitespace are not
  // part of them (held until more text shows which it is). Arguments that begin as a JSON object
  // end with it, so that a fence or marker inside one of its strings does not end them.
  bool RunArgs(ParsedText* out, bool final) {
    if (!args_begun_) {
      const size_t first = input_.find_first_not_of(" \t\r\n");
      input_.erase(0, first == std::string::npos ? input_.size() : first);
      if (input_.empty() && !final) return false;
      args_begun_ = !input_.empty();
      json_args_ = args_begun_ && input_[0] == '{';
      scanned_ = 0;
      depth_ = 0;
      in_string_ = escape_ = false;
    }
    if (json_args_) return RunJsonArgs(out, final);
    absl::string_view which;
    const size_t at = FindFirst({kFence, kDsCallEnd}, &which);
    if (at != std::string::npos) {
      Arguments(out, absl::StripTrailingAsciiWhitespace(absl::string_view(input_).substr(0, at)));
      input_.erase(0, at + which.size());
      if (which == kDsCallEnd) return EndCall();
      mode_ = Mode::kAfterArgs;
      return true;
    }
    if (final) {
      Arguments(out, absl::StripTrailingAsciiWhitespace(input_));
      input_.clear();
      calls_.back().arguments_valid = IsJsonObject(calls_.back().arguments);
      return false;
    }
    size_t emit = input_.size() - std::max(MarkerPrefixAtEnd(input_, kFence),
                                           MarkerPrefixAtEnd(input_, kDsCallEnd));
    while (emit > 0 && IsSpace(input_[emit - 1])) --emit;
    emit = Utf8SafeLength(absl::string_view(input_).substr(0, emit));
    Arguments(out, absl::string_view(input_).substr(0, emit));
    input_.erase(0, emit);
    return false;
  }

  // JSON arguments, scanned as they arrive (whitespace after the last scanned byte held back):
  // they end where their object closes.
  bool RunJsonArgs(ParsedText* out, bool final) {
    size_t end = 0;  // one past the object's last byte, once it closed
    for (; scanned_ < input_.size() && end == 0; ++scanned_) {
      const char c = input_[scanned_];
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
      } else if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if ((c == '}' || c == ']') && --depth_ == 0) {
        end = scanned_ + 1;
      }
    }
    if (end != 0) {
      Arguments(out, absl::string_view(input_).substr(0, end));
      input_.erase(0, end);
      scanned_ = 0;
      after_json_ = true;
      mode_ = Mode::kAfterArgs;
      return true;
    }
    size_t emit = input_.size();
    while (emit > 0 && IsSpace(input_[emit - 1])) --emit;
    if (!final) emit = Utf8SafeLength(absl::string_view(input_).substr(0, emit));
    Arguments(out, absl::string_view(input_).substr(0, emit));
    input_.erase(0, final ? input_.size() : emit);
    scanned_ = final ? 0 : scanned_ - emit;
    if (final) calls_.back().arguments_valid = IsJsonObject(calls_.back().arguments);
    return false;
  }

  bool RunAfterArgs(bool final) {
    size_t first = input_.find_first_not_of(" \t\r\n");
    if (after_json_ && first != std::string::npos) {  // V3's closing fence, after JSON arguments
      const absl::string_view rest = absl::string_view(input_).substr(first);
      if (absl::StartsWith(rest, kFence)) {
        input_.erase(0, first + kFence.size());
        after_json_ = false;
        first = input_.find_first_not_of(" \t\r\n");
      } else if (!final && CouldBegin(rest, kFence)) {
        return false;
      } else {
        after_json_ = false;
      }
    }
    const absl::string_view rest =
        first == std::string::npos ? absl::string_view() : absl::string_view(input_).substr(first);
    if (absl::StartsWith(rest, kDsCallEnd)) {
      input_.erase(0, first + kDsCallEnd.size());
      return EndCall();
    }
    if (!final && CouldBegin(rest, kDsCallEnd)) return false;
    return EndCall();  // no end marker: the call was whole anyway
  }

  bool EndCall() {
    mode_ = Mode::kCalls;
    Complete();
    return true;
  }

  // The call's head is content after all: as written, through its end marker.
  bool ToRaw(ParsedText* out) {
    out->content += call_text_;
    call_text_.clear();
    mode_ = Mode::kRawCall;
    return true;
  }

  bool RunRaw(ParsedText* out, bool final) {
    const size_t end = input_.find(kDsCallEnd.data(), 0, kDsCallEnd.size());
    if (end != std::string::npos) {
      out->content.append(input_, 0, end + kDsCallEnd.size());
      input_.erase(0, end + kDsCallEnd.size());
      mode_ = Mode::kCalls;
      return true;
    }
    ReleaseContent({kDsCallEnd}, final, out);
    return false;
  }

  Mode mode_ = Mode::kText;
  std::string call_text_;  // the current call's markers and head, as written
  bool args_begun_ = false;
  // Arguments that began with '{': their JSON is scanned (depth, strings) to find their end.
  bool json_args_ = false;
  size_t scanned_ = 0;  // bytes of input_ scanned
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  bool after_json_ = false;  // kAfterArgs after JSON arguments: V3's fence may come first
};

}  // namespace

std::unique_ptr<ToolCallParser> NewDeepSeekToolCallParser(ToolCallParserOptions options) {
  return std::make_unique<DeepSeekToolCallParser>(std::move(options));
}

}  // namespace tool_call_internal
}  // namespace ferry
