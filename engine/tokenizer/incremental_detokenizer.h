// Streaming detokenization: turns a growing sequence of output tokens into text deltas, emitting
// only text that is complete UTF-8 and will not change when more tokens arrive: a character split
// across byte-level tokens is held back, and so is a run of <0xXX> byte-fallback tokens until it
// ends (HF renders an invalid run as one U+FFFD per byte, so its text is known only at its end);
// start-of-text rules (Strip, Metaspace) apply as in a full decode.
//
// Contract, checked by tests on every prefix of every test string: the deltas concatenated,
// followed by Finish(), equal Tokenizer::Decode of all the tokens (with skip_special, of all but
// the special tokens not kept).
//
// Thread-compatible; one per output stream. The tokenizer must outlive it.

#ifndef FERRY_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define FERRY_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/token_id.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {

class IncrementalDetokenizer {
 public:
  // `skip_special`: special tokens add no text, but for those in `keep` (their text stays).
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false,
                                  std::vector<TokenId> keep = {})
      : tokenizer_(tokenizer), skip_special_(skip_special), keep_(std::move(keep)) {}

  // Adds one token and returns the text that became final (often empty while a character is
  // incomplete). An id outside the vocabulary is an error and changes nothing.
  absl::StatusOr<std::string> Push(TokenId id);

  // End of stream: returns what was held back (an incomplete character becomes U+FFFD, as in
  // Tokenizer::Decode).
  absl::StatusOr<std::string> Finish();

  size_t tokens() const { return pushed_; }

 private:
  const Tokenizer& tokenizer_;
  const bool skip_special_;
  const std::vector<TokenId> keep_;
  std::vector<TokenId> ids_;  // the tokens that add text (skipped special ones are left out)
  // Text of ids_[prefix_offset_, read_offset_) has been emitted; the window starts at
  // prefix_offset_ so that start-of-text rules (Strip, Metaspace) apply as in a full decode.
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  std::string emitted_;  // everything returned so far
  size_t pushed_ = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
