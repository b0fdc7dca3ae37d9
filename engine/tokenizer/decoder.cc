#include "engine/tokenizer/decoder.h"

#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/utf8.h"

namespace ferry {
int ByteFallbackValue(absl::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

std::string ByteLevelTokenBytes(absl::string_view token) {
  std::string bytes;
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = UnicodeToByte(NextCodePoint(token, &pos));
    if (b < 0) return std::string(token);
    bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

std::string Decoder::DecodeToBytes(std::vector<std::string> tokens) const {
  for (const DecoderStep& step : steps_) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& t : tokens) bytes += ByteLevelTokenBytes(t);
        // HF repairs UTF-8 here; the repair is left to the caller, so that streaming can hold
        // incomplete characters back. Later steps see the raw bytes.
        tokens = {std::move(bytes)};
        break;
      }
      case DecoderStep::Kind::kReplace:
        for (std::string& t : tokens) t = absl::StrReplaceAll(t, {{step.pattern, step.content}});
        break;
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;  // consecutive byte tokens
        auto flush = [&] {
          if (pending.empty()) return;
          if (IsValidUtf8(pending)) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xef\xbf\xbd");
          }
          pending.clear();
        };
        for (std::string& t : tokens) {
          const int b = ByteFallbackValue(t);
          if (b >= 0) {
            pending.push_back(static_cast<char>(b));
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        tokens.swap(out);
        break;
      }
      case DecoderStep::Kind::kFuse:
        tokens = {absl::StrJoin(tokens, "")};
        break;
      case DecoderStep::Kind::kStrip:
        for (std::string& t : tokens) {
          int n = 0;
          while (n < step.start && t.compare(0, step.content.size(), step.content) == 0 &&
                 !step.content.empty()) {
            t.erase(0, step.content.size());
            ++n;
          }
          n = 0;
          while (n < step.stop && t.size() >= step.content.size() && !step.content.empty() &&
                 t.compare(t.size() - step.content.size(), step.content.size(), step.content) ==
                     0) {
            t.resize(t.size() - step.content.size());
            ++n;
          }
        }
        break;
      case DecoderStep::Kind::kMetaspace:
        // As HF: every replacement character becomes a space, except in the first token, where
        // (unless prepend_scheme is "never") each one is dropped.
        for (size_t i = 0; i < tokens.size(); ++i) {
          const bool drop = i == 0 && !step.prepend_scheme_never;
          tokens[i] = absl::StrReplaceAll(tokens[i], {{step.pattern, drop ? "" : " "}});
        }
        break;
    }
  }
  return absl::StrJoin(tokens, "");
}

}  // namespace ferry
