// Normalization of input text before pre-tokenization, as HF `tokenizers` defines it: Unicode
// normal forms (NFC, NFD, NFKC, NFKD via utf8proc), Lowercase, Replace, Prepend, Strip, and
// Sequence of those.

#ifndef FERRY_ENGINE_TOKENIZER_NORMALIZER_H_
#define FERRY_ENGINE_TOKENIZER_NORMALIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/regex.h"

namespace ferry {

struct NormalizerStep {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace, kPrepend, kStrip };
  Kind kind = Kind::kNfc;
  // kReplace: a literal `pattern`, or `regex` when the pattern is a regular expression.
  std::string pattern;
  std::shared_ptr<const UnicodeRegex> regex;
  std::string content;  // kReplace's replacement, kPrepend's prefix
  bool strip_left = false, strip_right = false;
};

// Thread-safe after construction.
class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }
  // True when every step is a Unicode normal form (or there is none): such a normalizer acts on
  // each piece of text independently of the text around a line break.
  bool unicode_forms_only() const;
  // `text` must be valid UTF-8.
  absl::StatusOr<std::string> Normalize(absl::string_view text) const;

 private:
  std::vector<NormalizerStep> steps_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_NORMALIZER_H_
