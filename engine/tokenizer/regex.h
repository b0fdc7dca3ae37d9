// A compiled Unicode regular expression (Oniguruma, UTF-8, Ruby syntax: the engine and syntax
// HF `tokenizers` uses, so the models' pre-tokenizer patterns mean exactly what they mean there).
// Used to split text into pre-tokens; never std::regex (no \p{..}, recursive matching).

#ifndef FERRY_ENGINE_TOKENIZER_REGEX_H_
#define FERRY_ENGINE_TOKENIZER_REGEX_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// The GPT-2 split pattern (HF ByteLevel's built-in regex).
inline constexpr char kGpt2Pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Thread-safe: Find() may run concurrently from many threads.
class UnicodeRegex {
 public:
  static absl::StatusOr<std::unique_ptr<UnicodeRegex>> Compile(absl::string_view pattern);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  const std::string& pattern() const { return pattern_; }

  // Appends the [begin, end) byte ranges of successive non-overlapping matches in `text`
  // (valid UTF-8), searching on after each match (one character on after an empty one).
  absl::Status FindAll(absl::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  // Hand-written matchers for the hottest patterns, used where they are exact: the GPT-2 split
  // pattern on pure-ASCII text, and \p{N} on ASCII characters (a non-ASCII character is still
  // matched by Oniguruma). Tests compare them with HF and llama.cpp on every run.
  enum class Fast { kNone, kGpt2, kNumber };
  absl::Status FindAllOniguruma(absl::string_view text,
                                std::vector<std::pair<size_t, size_t>>* out) const;
  void FindAllGpt2Ascii(absl::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;
  absl::Status FindAllNumbers(absl::string_view text,
                              std::vector<std::pair<size_t, size_t>>* out) const;

  UnicodeRegex() = default;
  Fast fast_ = Fast::kNone;
  std::string pattern_;
  void* regex_ = nullptr;  // OnigRegex
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_REGEX_H_
