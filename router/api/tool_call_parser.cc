#include "router/api/tool_call_parser.h"

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "router/api/streamed_text.h"

namespace ferry {
namespace {

bool IsSpace(char c) { return absl::ascii_isspace(static_cast<unsigned char>(c)); }

// A JSON string literal (quotes included) decoded; false when it is not one.
bool DecodeJsonString(absl::string_view literal, std::string* out) {
  nlohmann::json j = nlohmann::json::parse(literal.begin(), literal.end(), nullptr, false);
  if (!j.is_string()) return false;
  *out = j.get<std::string>();
  return true;
}

bool IsJsonObject(absl::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  return j.is_object();
}

// What every format shares: the input not yet consumed, the calls, and how deltas are made.
class ParserBase : public ToolCallParser {
 public:
  explicit ParserBase(ToolCallParserOptions options) : options_(std::move(options)) {}

  void Feed(absl::string_view text, ParsedText* out) override {
    if (dropping_) return;
    input_.append(text.data(), text.size());
    Run(out, /*final=*/false);
    if (dropping_) input_.clear();
  }

  void Finish(ParsedText* out) override {
    if (dropping_) return;
    Run(out, /*final=*/true);
    input_.clear();
  }

  const std::vector<ParsedToolCall>& calls() const override { return calls_; }

 protected:
  // Consumes as much of input_ as the format allows (all of it once `final`).
  virtual void Run(ParsedText* out, bool final) = 0;

  bool Known(const std::string& name) const {
    return options_.functions.empty() ||
           std::find(options_.functions.begin(), options_.functions.end(), name) !=
               options_.functions.end();
  }

  // A call named `name` begins: its first delta.
  void Begin(const std::string& name, ParsedText* out) {
    const int index = static_cast<int>(calls_.size());
    ParsedToolCall call;
    call.id = options_.call_id ? options_.call_id(index) : absl::StrCat("call_", index);
    call.name = name;
    ToolCallDelta delta;
    delta.index = index;
    delta.id = call.id;
    delta.name = call.name;
    calls_.push_back(std::move(call));
    out->tool_calls.push_back(std::move(delta));
  }

  // More of the current call's arguments (joined to this output's last delta of that call).
  void Arguments(ParsedText* out, absl::string_view piece) {
    if (piece.empty()) return;
    calls_.back().arguments.append(piece.data(), piece.size());
    if (!out->tool_calls.empty() &&
        out->tool_calls.back().index == static_cast<int>(calls_.size()) - 1) {
      out->tool_calls.back().arguments.append(piece.data(), piece.size());
      return;
    }
    ToolCallDelta delta;
    delta.index = static_cast<int>(calls_.size()) - 1;
    delta.arguments = std::string(piece);
    out->tool_calls.push_back(std::move(delta));
  }

  // The current call ended (its closing marker or its object's end).
  void Complete() {
    ParsedToolCall& call = calls_.back();
    call.complete = true;
    call.arguments_valid = IsJsonObject(call.arguments);
    if (options_.first_call_only) dropping_ = true;
  }

  // Moves input_ to content but for what may still begin one of `markers` or ends inside a
  // character (everything once `final`).
  void ReleaseContent(std::initializer_list<absl::string_view> markers, bool final,
                      ParsedText* out) {
    size_t emit = input_.size();
    if (!final) {
      size_t hold = 0;
      for (absl::string_view m : markers) hold = std::max(hold, MarkerPrefixAtEnd(input_, m));
      emit -= hold;
      emit = Utf8SafeLength(absl::string_view(input_).substr(0, emit));
    }
    out->content.append(input_, 0, emit);
    input_.erase(0, emit);
  }

  // The earliest of `markers` in input_: its position (npos if none) and which one.
  size_t FindFirst(std::initializer_list<absl::string_view> markers, absl::string_view* which) {
    size_t best = std::string::npos;
    for (absl::string_view m : markers) {
      const size_t at = input_.find(m.data(), 0, m.size());
      if (at < best) {
        best = at;
        *which = m;
      }
    }
    return best;
  }

  const ToolCallParserOptions options_;
  std::vector<ParsedToolCall> calls_;
  std::string input_;  // fed text not yet consumed
  bool dropping_ = false;
};

// Hermes, Llama 3 JSON and Mistral: JSON call objects, framed by markers.
struct JsonFraming {
  std::string open;            // the marker before a call or a group of calls
  std::string close;           // the marker after each call ("" for none)
  bool at_start_only = false;  // calls only at the reply's start (the open marker optional)
  bool list = false;           // the group may be a JSON array of calls
  char separator = 0;          // between the calls of a group (0: none)
};

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

// DeepSeek V3 / R1 (and V3.1's shorter call head).
constexpr absl::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr absl::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr absl::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr absl::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr absl::string_view kDsSep = "<｜tool▁sep｜>";
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
  // part of them (held until more text shows which it is).
  bool RunArgs(ParsedText* out, bool final) {
    if (!args_begun_) {
      const size_t first = input_.find_first_not_of(" \t\r\n");
      input_.erase(0, first == std::string::npos ? input_.size() : first);
      if (input_.empty() && !final) return false;
      args_begun_ = !input_.empty();
    }
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

  bool RunAfterArgs(bool final) {
    const size_t first = input_.find_first_not_of(" \t\r\n");
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
};

}  // namespace

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kDeepSeek:
      return "deepseek";
  }
  return "";
}

std::optional<ToolCallFormat> ToolCallFormatFromName(absl::string_view name) {
  for (ToolCallFormat f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json,
                           ToolCallFormat::kMistral, ToolCallFormat::kDeepSeek}) {
    if (name == ToolCallFormatName(f)) return f;
  }
  return std::nullopt;
}

std::optional<ToolCallFormat> DetectToolCallFormat(absl::string_view source) {
  if (absl::StrContains(source, "<tool_call>")) return ToolCallFormat::kHermes;
  if (absl::StrContains(source, "[TOOL_CALLS]")) return ToolCallFormat::kMistral;
  if (absl::StrContains(source, kDsCallBegin)) return ToolCallFormat::kDeepSeek;
  if (absl::StrContains(source, "<|python_tag|>") ||
      (absl::StrContains(source, "\"parameters\"") && absl::StrContains(source, "ipython"))) {
    return ToolCallFormat::kLlama3Json;
  }
  return std::nullopt;
}

std::vector<std::string> ToolCallMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return {"<tool_call>", "</tool_call>"};
    case ToolCallFormat::kLlama3Json:
      return {"<|python_tag|>"};
    case ToolCallFormat::kMistral:
      return {"[TOOL_CALLS]"};
    case ToolCallFormat::kDeepSeek:
      return {std::string(kDsCallsBegin), std::string(kDsCallsEnd), std::string(kDsCallBegin),
              std::string(kDsCallEnd), std::string(kDsSep)};
  }
  return {};
}

std::unique_ptr<ToolCallParser> NewToolCallParser(ToolCallFormat format,
                                                  ToolCallParserOptions options) {
  JsonFraming framing;
  switch (format) {
    case ToolCallFormat::kHermes:
      framing.open = "<tool_call>";
      framing.close = "</tool_call>";
      break;
    case ToolCallFormat::kLlama3Json:
      framing.open = "<|python_tag|>";
      framing.at_start_only = true;
      framing.separator = ';';
      break;
    case ToolCallFormat::kMistral:
      framing.open = "[TOOL_CALLS]";
      framing.list = true;
      framing.separator = ',';
      break;
    case ToolCallFormat::kDeepSeek:
      return std::make_unique<DeepSeekToolCallParser>(std::move(options));
  }
  return std::make_unique<JsonToolCallParser>(std::move(framing), std::move(options));
}

}  // namespace ferry
