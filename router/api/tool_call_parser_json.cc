// Hermes / Qwen 2.5-3 (`<tool_call>` blocks), Llama 3 JSON (a reply that is calls) and Mistral
// (`[TOOL_CALLS]` and a list): JSON call objects, framed by markers (tool_call_parser.h).

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "router/api/streamed_text.h"
#include "router/api/tool_call_parser_internal.h"

namespace ferry {
namespace tool_call_internal {
namespace {

class JsonToolCallParser : public ParserBase {
 public:
  JsonToolCallParser(JsonFraming framing, ToolCallParserOptions options)
      : ParserBase(std::move(options)), f_(std::move(framing)) {
    mode_ = f_.at_start_only ? Mode::kStart : Mode::kText;
  }

 private:
  enum class Mode {
    kStart,      // at_start_only: nothing but whitespace yet
    kText,       // content; input_ holds what may still begin a marker
    kGroup,      // after the open marker or a call of a group: '[', ',' / ';', ']', or an object
    kCall,       // inside a call object: the JSON is scanned in body_
    kAfterCall,  // the call's JSON ended: waiting for the close marker
    kRawCall,    // a block that is not a call: content up to and including the close marker
    kBroken,     // a begun call whose JSON broke: skipped up to the close marker
    kPlain,      // the rest is content
  };
  // Where the scanner is inside the call's top-level object.
  enum class Expect { kKey, kKeyString, kColon, kValue, kString, kContainer, kScalar, kComma };

  void Run(ParsedText* out, bool final) override {
    bool progress = true;
    while (progress && !dropping_) {
      progress = false;
      switch (mode_) {
        case Mode::kStart:
          progress = RunStart(out, final);
          break;
        case Mode::kText:
          progress = RunText(out, final);
          break;
        case Mode::kGroup:
          progress = RunGroup(out, final);
          break;
        case Mode::kCall:
          progress = RunCall(out, final);
          break;
        case Mode::kAfterCall:
          progress = RunAfterCall(final);
          break;
        case Mode::kRawCall:
        case Mode::kBroken:
          progress = RunUntilClose(out, final);
          break;
        case Mode::kPlain:
          ReleaseContent({}, final, out);
          break;
      }
    }
  }

  // The reply's start: a call (the open marker, or an object right away) or content throughout.
  bool RunStart(ParsedText* out, bool final) {
    const size_t first = input_.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) {
      if (!final) return false;
      mode_ = Mode::kPlain;
      return true;
    }
    const absl::string_view rest = absl::string_view(input_).substr(first);
    if (!f_.open.empty() && absl::StartsWith(rest, f_.open)) {
      OpenGroup(first + f_.open.size());
      return true;
    }
    if (!f_.open.empty() && CouldBegin(rest, f_.open) && !final) return false;
    if (rest[0] == '{') {
      OpenGroup(first);
      return true;
    }
    mode_ = Mode::kPlain;
    return true;
  }

  // Content up to an opening marker; true when the mode changed. Whitespace between or after
  // calls is formatting, not content.
  bool RunText(ParsedText* out, bool final) {
    if (after_call_) {
      const size_t first = input_.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) {
        if (final) input_.clear();
        return false;
      }
      const absl::string_view rest = absl::string_view(input_).substr(first);
      if (absl::StartsWith(rest, f_.open)) {
        input_.erase(0, first);
      } else if (!final && CouldBegin(rest, f_.open)) {
        return false;
      }
      after_call_ = false;
    }
    const size_t open = input_.find(f_.open);
    if (open != std::string::npos) {
      out->content.append(input_, 0, open);
      input_.erase(0, open);
      OpenGroup(f_.open.size());
      return true;
    }
    ReleaseContent({f_.open}, final, out);
    return false;
  }

  // The first `consumed` bytes of input_ opened a group (kept in case it is content after all).
  void OpenGroup(size_t consumed) {
    group_text_ = input_.substr(0, consumed);
    input_.erase(0, consumed);
    in_list_ = false;
    need_object_ = true;
    group_calls_ = 0;
    if (!f_.close.empty()) {  // Hermes: a block is one call
      StartCall();
      return;
    }
    mode_ = Mode::kGroup;
  }

  // Between the calls of a group.
  bool RunGroup(ParsedText* out, bool final) {
    size_t i = 0;
    while (i < input_.size() && IsSpace(input_[i])) ++i;
    if (i == input_.size()) {
      if (!final) return false;
      EndGroup(out, /*as_text=*/group_calls_ == 0);
      return true;
    }
    const char c = input_[i];
    if (c == '{' && (need_object_ || group_calls_ == 0)) {
      group_text_.append(input_, 0, i);
      input_.erase(0, i);
      StartCall();
      return true;
    }
    if (f_.list && c == '[' && !in_list_ && group_calls_ == 0) {
      in_list_ = true;
      group_text_.append(input_, 0, i + 1);
      input_.erase(0, i + 1);
      return true;
    }
    if (group_calls_ > 0 && !need_object_) {
      if (f_.separator != 0 && c == f_.separator) {
        need_object_ = true;
        group_text_.assign(input_, 0, i + 1);
        input_.erase(0, i + 1);
        return true;
      }
      if (in_list_ && c == ']') {
        input_.erase(0, i + 1);
        EndGroup(out, /*as_text=*/false);
        return true;
      }
    }
    EndGroup(out, /*as_text=*/true);
    return true;
  }

  // The group ended; `as_text`: what opened it (or the last separator) was content after all.
  void EndGroup(ParsedText* out, bool as_text) {
    if (as_text) out->content += group_text_;
    after_call_ = !as_text;
    group_text_.clear();
    mode_ = f_.at_start_only ? Mode::kPlain : Mode::kText;
  }

  void StartCall() {
    mode_ = Mode::kCall;
    body_.clear();
    scanned_ = 0;
    depth_ = 0;
    in_string_ = escape_ = false;
    expect_ = Expect::kKey;
    key_.clear();
    name_.clear();
    have_name_ = begun_ = false;
    args_start_ = args_end_ = std::string::npos;
    args_string_ = false;
    args_emitted_ = 0;
    object_end_ = std::string::npos;
  }

  bool RunCall(ParsedText* out, bool final) {
    body_ += input_;
    input_.clear();
    // Scan stops where the name ends, so that the call begins there however the text was split.
    while (true) {
      if (!Scan()) {
        if (!begun_) return ToRaw(out);
        EmitArguments(out, /*ended=*/true);  // what came before the break, as split text would
        calls_.back().arguments_valid = false;
        if (f_.close.empty()) {  // no marker to resynchronize on: the rest is dropped
          calls_.back().complete = true;
          dropping_ = true;
          return true;
        }
        mode_ = Mode::kBroken;
        input_ = body_.substr(scanned_);
        return true;
      }
      if (!have_name_ || begun_) break;
      if (!Known(name_)) return ToRaw(out);
      begun_ = true;
      Begin(name_, out);
    }
    if (begun_) EmitArguments(out, final || object_end_ != std::string::npos);
    if (object_end_ != std::string::npos) {
      if (!begun_) return ToRaw(out);  // an object without a name
      if (args_start_ == std::string::npos) Arguments(out, "{}");
      input_ = body_.substr(object_end_);
      if (!f_.close.empty()) {
        mode_ = Mode::kAfterCall;
        return true;
      }
      Complete();
      ++group_calls_;
      need_object_ = false;
      group_text_.clear();
      mode_ = Mode::kGroup;
      return true;
    }
    if (final) {
      if (!begun_) return ToRaw(out);
      ParsedToolCall& call = calls_.back();
      call.arguments_valid = IsJsonObject(call.arguments);
    }
    return false;
  }

  // The block so far is content after all (nothing of it was emitted as a call).
  bool ToRaw(ParsedText* out) {
    out->content += group_text_;
    group_text_.clear();
    input_ = std::move(body_);
    body_.clear();
    if (!f_.close.empty()) {
      mode_ = Mode::kRawCall;
    } else {
      mode_ = f_.at_start_only ? Mode::kPlain : Mode::kText;
    }
    return true;
  }

  // The arguments' bytes scanned since the last emission (all of them once `ended`).
  void EmitArguments(ParsedText* out, bool ended) {
    if (args_start_ == std::string::npos) return;
    if (args_string_) {  // stringified JSON: decoded, in one piece, once the string ends
      if (args_end_ == std::string::npos || args_emitted_ != 0) return;
      std::string decoded;
      const absl::string_view literal =
          absl::string_view(body_).substr(args_start_, args_end_ - args_start_);
      args_emitted_ = args_end_;
      Arguments(out, DecodeJsonString(literal, &decoded) ? absl::string_view(decoded) : literal);
      return;
    }
    const size_t from = std::max(args_emitted_, args_start_);
    const size_t to = args_end_ != std::string::npos ? args_end_ : scanned_;
    if (to <= from) return;
    absl::string_view piece = absl::string_view(body_).substr(from, to - from);
    if (!ended && args_end_ == std::string::npos) piece = piece.substr(0, Utf8SafeLength(piece));
    args_emitted_ = from + piece.size();
    Arguments(out, piece);
  }

  // Scans body_ from scanned_ up to its end or the top-level object's end. False: not a call's
  // JSON (the block is content, or a begun call broke).
  bool Scan() {
    for (; scanned_ < body_.size() && object_end_ == std::string::npos && (begun_ || !have_name_);
         ++scanned_) {
      const size_t i = scanned_;
      const char c = body_[i];
      if (in_string_) {
        if (escape_) {
          escape_ = false;
        } else if (c == '\\') {
          escape_ = true;
        } else if (c == '"') {
          in_string_ = false;
          if (depth_ == 1 && expect_ == Expect::kKeyString) {
            if (!DecodeJsonString(absl::string_view(body_).substr(key_start_, i + 1 - key_start_),
                                  &key_)) {
              return false;
            }
            expect_ = Expect::kColon;
          } else if (depth_ == 1 && expect_ == Expect::kString) {
            if (!ValueEnded(i + 1, /*is_string=*/true)) return false;
          }
        }
        continue;
      }
      if (depth_ == 0) {
        if (IsSpace(c)) continue;
        if (c != '{') return false;
        depth_ = 1;
        expect_ = Expect::kKey;
        continue;
      }
      if (depth_ == 1 && expect_ == Expect::kScalar && (c == ',' || c == '}' || IsSpace(c))) {
        if (!ValueEnded(i, /*is_string=*/false)) return false;
      }
      if (IsSpace(c)) continue;
      if (depth_ > 1) {
        if (c == '"') {
          in_string_ = true;
        } else if (c == '{' || c == '[') {
          ++depth_;
        } else if (c == '}' || c == ']') {
          --depth_;
          if (depth_ == 1 && expect_ == Expect::kContainer && !ValueEnded(i + 1, false)) {
            return false;
          }
        }
        continue;
      }
      // depth 1: the call's own object.
      switch (expect_) {
        case Expect::kKey:
          if (c == '}') {
            object_end_ = i + 1;
          } else if (c == '"') {
            in_string_ = true;
            key_start_ = i;
            expect_ = Expect::kKeyString;
          } else {
            return false;
          }
          break;
        case Expect::kColon:
          if (c != ':') return false;
          expect_ = Expect::kValue;
          break;
        case Expect::kValue:
          ValueStarted(i, c == '"');
          if (c == '"') {
            in_string_ = true;
            expect_ = Expect::kString;
          } else if (c == '{' || c == '[') {
            ++depth_;
            expect_ = Expect::kContainer;
          } else if (c == '}' || c == ',' || c == ':' || c == ']') {
            return false;
          } else {
            expect_ = Expect::kScalar;
          }
          break;
        case Expect::kScalar:
          break;  // more of the scalar
        case Expect::kComma:
          if (c == ',') {
            expect_ = Expect::kKey;
          } else if (c == '}') {
            object_end_ = i + 1;
          } else {
            return false;
          }
          break;
        case Expect::kKeyString:
        case Expect::kString:
        case Expect::kContainer:
          return false;  // (not reached: strings and containers are handled above)
      }
    }
    return true;
  }

  // Hermes and Mistral write "arguments"; Llama 3.x "parameters".
  bool IsArgumentsKey() const { return key_ == "arguments" || key_ == "parameters"; }

  void ValueStarted(size_t at, bool is_string) {
    value_start_ = at;
    if (IsArgumentsKey() && args_start_ == std::string::npos) {
      args_start_ = at;
      args_string_ = is_string;
    }
  }

  // The depth-1 value that began at value_start_ ended before `end`.
  bool ValueEnded(size_t end, bool is_string) {
    expect_ = Expect::kComma;
    const absl::string_view value =
        absl::string_view(body_).substr(value_start_, end - value_start_);
    if (key_ == "name" && !have_name_) {
      if (!is_string || !DecodeJsonString(value, &name_) || name_.empty()) return false;
      have_name_ = true;
    } else if (IsArgumentsKey() && args_start_ == value_start_) {
      args_end_ = end;
    }
    return true;
  }

  // After the call's JSON: whitespace, then the close marker.
  bool RunAfterCall(bool final) {
    const size_t first = input_.find_first_not_of(" \t\r\n");
    if (first != std::string::npos &&
        absl::string_view(input_).substr(first, f_.close.size()) == absl::string_view(f_.close)) {
      input_.erase(0, first + f_.close.size());
      mode_ = Mode::kText;
      after_call_ = true;
      Complete();
      return true;
    }
    const absl::string_view rest =
        first == std::string::npos ? absl::string_view() : absl::string_view(input_).substr(first);
    if (CouldBegin(rest, f_.close) && !final) return false;
    // Anything else: the call was whole; what follows is text again.
    mode_ = Mode::kText;
    Complete();
    return true;
  }

  // kRawCall: content through the close marker; kBroken: dropped through it, the call ends there.
  bool RunUntilClose(ParsedText* out, bool final) {
    const bool raw = mode_ == Mode::kRawCall;
    const size_t close = input_.find(f_.close);
    if (close != std::string::npos) {
      if (raw) out->content.append(input_, 0, close + f_.close.size());
      input_.erase(0, close + f_.close.size());
      mode_ = Mode::kText;
      if (!raw) {
        calls_.back().complete = true;
        after_call_ = true;
        if (options_.first_call_only) dropping_ = true;
      }
      return true;
    }
    if (!raw) {  // nothing of a broken call is kept but what may begin its closing marker
      input_.erase(0, final ? input_.size() : input_.size() - MarkerPrefixAtEnd(input_, f_.close));
      return false;
    }
    ReleaseContent({f_.close}, final, out);
    return false;
  }

  const JsonFraming f_;
  Mode mode_;
  bool after_call_ = false;  // kText right after a call: whitespace is held, then dropped
  // The group's opening text (marker, whitespace, '[') or its last separator, not yet known to
  // be content or framing.
  std::string group_text_;
  bool in_list_ = false;
  bool need_object_ = true;
  int group_calls_ = 0;
  // kCall: the object's text, and the scanner over it.
  std::string body_;
  size_t scanned_ = 0;
  int depth_ = 0;
  bool in_string_ = false;
  bool escape_ = false;
  Expect expect_ = Expect::kKey;
  size_t key_start_ = 0;
  std::string key_;
  size_t value_start_ = 0;
  std::string name_;
  bool have_name_ = false;
  bool begun_ = false;  // the call's first delta went out
  size_t args_start_ = std::string::npos;
  size_t args_end_ = std::string::npos;
  bool args_string_ = false;
  size_t args_emitted_ = 0;  // body_ offset up to which arguments went out
  size_t object_end_ = std::string::npos;
};

}  // namespace

std::unique_ptr<ToolCallParser> NewJsonToolCallParser(JsonFraming framing,
                                                      ToolCallParserOptions options) {
  return std::make_unique<JsonToolCallParser>(std::move(framing), std::move(options));
}

}  // namespace tool_call_internal
}  // namespace ferry
