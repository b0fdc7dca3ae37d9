// Pre-tokenization: splitting normalized text into the pieces BPE works on, as HF `tokenizers`
// defines it (Split, Digits, ByteLevel, Metaspace, and Sequence of those). A pipeline applies
// each step to every piece the previous step produced.

#ifndef FERRY_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
#define FERRY_ENGINE_TOKENIZER_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/tokenizer/regex.h"

namespace ferry {

// How the matches of a split pattern relate to the text around them (HF's
// SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Metaspace's prepend_scheme: add the replacement character before the first piece always, only
// at the start of the input, or never.
enum class PrependScheme { kAlways, kFirst, kNever };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  Kind kind = Kind::kSplit;
  // kSplit (Split, Digits) and kByteLevel with use_regex.
  std::shared_ptr<const UnicodeRegex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // kByteLevel.
  bool add_prefix_space = false;
  // kMetaspace.
  std::string replacement = "\xe2\x96\x81";  // U+2581
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
};

// Thread-safe after construction.
class PreTokenizer {
 public:
  PreTokenizer() = default;  // no steps: the whole text is one piece
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps);

  // Splits `text` into pieces (appended to `pieces`). `at_start`: the text begins the input
  // (not after an added token), for Metaspace's "first" scheme.
  absl::Status Split(absl::string_view text, bool at_start, std::vector<std::string>* pieces) const;

  // When no step rewrites text (only Split and ByteLevel without add_prefix_space), pieces are
  // ranges of the input: SplitRanges appends [begin, end) pairs without copying any text.
  bool splits_only() const { return splits_only_; }
  absl::Status SplitRanges(absl::string_view text,
                           std::vector<std::pair<size_t, size_t>>* ranges) const;

  const std::vector<PreTokenizerStep>& steps() const { return steps_; }

  // Steps for HF's Digits pre-tokenizer and ByteLevel (with its GPT-2 regex).
  static absl::StatusOr<PreTokenizerStep> DigitsStep(bool individual_digits);
  static absl::StatusOr<PreTokenizerStep> ByteLevelStep(bool add_prefix_space, bool use_regex);
  static absl::StatusOr<PreTokenizerStep> SplitStep(absl::string_view pattern,
                                                    SplitBehavior behavior, bool invert);

 private:
  std::vector<PreTokenizerStep> steps_;
  bool splits_only_ = true;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_PRE_TOKENIZER_H_
