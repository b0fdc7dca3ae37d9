#include "router/api/tool_call_parser.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

constexpr absl::string_view kOpen = "<tool_call>";
constexpr absl::string_view kClose = "</tool_call>";

// The longest prefix of `s` that does not end inside a UTF-8 character (bytes that cannot start
// or continue one count as complete: they are passed on, not held forever).
size_t Utf8SafeLength(absl::string_view s) {
  size_t start = s.size();
  for (int back = 0; back < 4 && start > 0; ++back) {
    --start;
    const auto c = static_cast<unsigned char>(s[start]);
    if ((c & 0xC0) != 0x80) {  // the last character's first byte
      const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      return s.size() - start >= need ? s.size() : start;
    }
  }
  return s.size();
}

// How many bytes at the end of `s` could begin `marker` (to be held until the next piece).
size_t MarkerPrefixAtEnd(absl::string_view s, absl::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

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

class HermesToolCallParser : public ToolCallParser {
 public:
  HermesToolCallParser(std::vector<std::string> functions, std::string id_prefix)
      : functions_(std::move(functions)), id_prefix_(std::move(id_prefix)) {}

  void Feed(absl::string_view text, ParsedText* out) override {
    input_.append(text.data(), text.size());
    Run(out, /*final=*/false);
  }

  void Finish(ParsedText* out) override { Run(out, /*final=*/true); }

  const std::vector<ParsedToolCall>& calls() const override { return calls_; }

 private:
  enum class Mode {
    kText,       // content; input_ holds what may still begin a marker
    kCall,       // inside <tool_call>: the JSON is scanned in body_
    kAfterCall,  // the call's JSON ended: waiting for </tool_call>
    kRawCall,    // a block that is not a call: content up to and including </tool_call>
    kBroken,     // a begun call whose JSON broke: skipped up to </tool_call>
  };
  // Where the scanner is inside the call's top-level object.
  enum class Expect { kKey, kKeyString, kColon, kValue, kString, kContainer, kScalar, kComma };

  void Run(ParsedText* out, bool final) {
    bool progress = true;
    while (progress) {
      progress = false;
      switch (mode_) {
        case Mode::kText:
          progress = RunText(out, final);
          break;
        case Mode::kCall:
          progress = RunCall(out, final);
          break;
        case Mode::kAfterCall:
          progress = RunAfterCall(out, final);
          break;
        case Mode::kRawCall:
        case Mode::kBroken:
          progress = RunUntilClose(out, final);
          break;
      }
    }
  }

  // Content up to an opening marker; true when the mode changed.
  bool RunText(ParsedText* out, bool final) {
    const size_t open = input_.find(kOpen.data(), 0, kOpen.size());
    if (open != std::string::npos) {
      out->content.append(input_, 0, open);
      input_.erase(0, open + kOpen.size());
      StartCall();
      return true;
    }
    ReleaseContent(kOpen, final, out);
    return false;
  }

  // Moves input_ to content but for what may still begin `marker` or end inside a character
  // (everything once `final`).
  void ReleaseContent(absl::string_view marker, bool final, ParsedText* out) {
    size_t emit = input_.size();
    if (!final) {
      emit -= MarkerPrefixAtEnd(input_, marker);
      emit = Utf8SafeLength(absl::string_view(input_).substr(0, emit));
    }
    out->content.append(input_, 0, emit);
    input_.erase(0, emit);
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
        mode_ = Mode::kBroken;
        input_ = body_.substr(scanned_);
        calls_.back().arguments_valid = false;
        return true;
      }
      if (!have_name_ || begun_) break;
      if (!functions_.empty() &&
          std::find(functions_.begin(), functions_.end(), name_) == functions_.end()) {
        return ToRaw(out);
      }
      Begin(out);
    }
    if (begun_) EmitArguments(out, final || object_end_ != std::string::npos);
    if (object_end_ != std::string::npos) {
      if (!begun_) return ToRaw(out);  // an object without a name
      if (args_start_ == std::string::npos) Arguments(out, "{}");
      input_ = body_.substr(object_end_);
      mode_ = Mode::kAfterCall;
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
    out->content.append(kOpen.data(), kOpen.size());
    input_ = std::move(body_);
    body_.clear();
    mode_ = Mode::kRawCall;
    return true;
  }

  void Begin(ParsedText* out) {
    begun_ = true;
    ParsedToolCall call;
    call.id = absl::StrCat(id_prefix_, calls_.size());
    call.name = name_;
    ToolCallDelta delta;
    delta.index = static_cast<int>(calls_.size());
    delta.id = call.id;
    delta.name = call.name;
    calls_.push_back(std::move(call));
    out->tool_calls.push_back(std::move(delta));
  }

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
        if (absl::ascii_isspace(static_cast<unsigned char>(c))) continue;
        if (c != '{') return false;
        depth_ = 1;
        expect_ = Expect::kKey;
        continue;
      }
      if (depth_ == 1 && expect_ == Expect::kScalar &&
          (c == ',' || c == '}' || absl::ascii_isspace(static_cast<unsigned char>(c)))) {
        if (!ValueEnded(i, /*is_string=*/false)) return false;
      }
      if (absl::ascii_isspace(static_cast<unsigned char>(c))) continue;
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

  // Hermes writes "arguments"; Llama 3.x's JSON calls, the same object otherwise, "parameters".
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

  // After the call's JSON: whitespace, then </tool_call>.
  bool RunAfterCall(ParsedText* out, bool final) {
    const size_t first = input_.find_first_not_of(" \t\r\n");
    if (first != std::string::npos &&
        absl::string_view(input_).substr(first, kClose.size()) == kClose) {
      Complete();
      input_.erase(0, first + kClose.size());
      mode_ = Mode::kText;
      return true;
    }
    const absl::string_view rest =
        first == std::string::npos ? absl::string_view() : absl::string_view(input_).substr(first);
    const bool could_close = rest.size() < kClose.size() && kClose.substr(0, rest.size()) == rest;
    if (could_close && !final) return false;
    // Anything else: the call was whole; what follows is text again.
    Complete();
    mode_ = Mode::kText;
    return true;
  }

  void Complete() {
    ParsedToolCall& call = calls_.back();
    call.complete = true;
    call.arguments_valid = IsJsonObject(call.arguments);
  }

  // kRawCall: content through </tool_call>; kBroken: dropped through it, the call ends there.
  bool RunUntilClose(ParsedText* out, bool final) {
    const bool raw = mode_ == Mode::kRawCall;
    const size_t close = input_.find(kClose.data(), 0, kClose.size());
    if (close != std::string::npos) {
      if (raw) out->content.append(input_, 0, close + kClose.size());
      if (!raw) calls_.back().complete = true;
      input_.erase(0, close + kClose.size());
      mode_ = Mode::kText;
      return true;
    }
    if (!raw) {  // nothing of a broken call is kept but what may begin its closing marker
      input_.erase(0, final ? input_.size() : input_.size() - MarkerPrefixAtEnd(input_, kClose));
      return false;
    }
    ReleaseContent(kClose, final, out);
    return false;
  }

  const std::vector<std::string> functions_;
  const std::string id_prefix_;
  std::vector<ParsedToolCall> calls_;
  Mode mode_ = Mode::kText;
  std::string input_;  // fed text not yet consumed by the mode
  // kCall: the block's text after <tool_call>, and the scanner over it.
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

std::unique_ptr<ToolCallParser> NewHermesToolCallParser(std::vector<std::string> functions,
                                                        std::string id_prefix) {
  return std::make_unique<HermesToolCallParser>(std::move(functions), std::move(id_prefix));
}

}  // namespace ferry
