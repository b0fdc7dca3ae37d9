// Decoding: token strings -> text, as HF `tokenizers` decoders define it (ByteLevel, Metaspace,
// Replace, ByteFallback, Fuse, Strip, and Sequence of those). Bytes that do not form valid UTF-8
// become U+FFFD, as in HF; the incremental detokenizer holds such bytes back instead.

#ifndef FERRY_ENGINE_TOKENIZER_DECODER_H_
#define FERRY_ENGINE_TOKENIZER_DECODER_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ferry {

struct DecoderStep {
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  Kind kind = Kind::kByteLevel;
  std::string pattern;      // kReplace: literal pattern; kMetaspace: the replacement character
  std::string content;      // kReplace: replacement; kStrip: the character stripped
  int start = 0, stop = 0;  // kStrip
  bool prepend_scheme_never = false;  // kMetaspace
};

// Thread-safe after construction.
class Decoder {
 public:
  Decoder() = default;
  explicit Decoder(std::vector<DecoderStep> steps) : steps_(std::move(steps)) {}

  // True when the chain is a single ByteLevel step: decoding is then a concatenation of
  // per-token bytes, which the tokenizer precomputes.
  bool byte_level_only() const {
    return steps_.size() == 1 && steps_[0].kind == DecoderStep::Kind::kByteLevel;
  }

  bool has_byte_fallback() const {
    for (const DecoderStep& step : steps_) {
      if (step.kind == DecoderStep::Kind::kByteFallback) return true;
    }
    return false;
  }

  // Decodes token strings (as they appear in the vocabulary) to raw bytes, without the final
  // UTF-8 repair (callers apply Utf8Lossy or hold incomplete bytes back).
  std::string DecodeToBytes(std::vector<std::string> tokens) const;

 private:
  std::vector<DecoderStep> steps_;
};

// "<0x41>" -> 0x41; -1 when `token` is not a byte-fallback token.
int ByteFallbackValue(absl::string_view token);

// The bytes a byte-level token stands for: its characters mapped back through the GPT-2
// alphabet, or its own UTF-8 bytes when a character is outside the alphabet (as HF does).
std::string ByteLevelTokenBytes(absl::string_view token);

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_DECODER_H_
