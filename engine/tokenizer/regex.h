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
  UnicodeRegex() = default;
  std::string pattern_;
  void* regex_ = nullptr;  // OnigRegex
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_REGEX_H_
