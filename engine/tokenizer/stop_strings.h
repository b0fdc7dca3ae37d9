// Stop strings over streamed text: text deltas go in (from the incremental detokenizer), text
// that can be shown comes out. A stop string may span any number of deltas; text that could be
// the start of a stop string is held back until it is known not to be. When a stop string
// appears, the text before it is released and the stream ends: the stop string itself and
// anything after it are never shown (the OpenAI convention).
//
// A request's min_tokens: text pushed with may_stop = false cannot end the stream; a stop string
// counts only when it ends in text pushed with may_stop = true.
//
// The held-back text is the whole state; it travels with a resumed request (held()/Restore()).

#ifndef FERRY_ENGINE_TOKENIZER_STOP_STRINGS_H_
#define FERRY_ENGINE_TOKENIZER_STOP_STRINGS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ferry {

// Limits on what a request may ask for.
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;

class StopStringMatcher {
 public:
  // At most kMaxStopStrings non-empty strings of at most kMaxStopStringBytes each.
  static absl::Status Validate(const std::vector<std::string>& stops);
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Adds text; returns what can be released now. After a stop string matched, `stopped()` is
  // true and further input is ignored. With may_stop false, no stop string can match in this
  // text (it is still held back while it could begin one that ends later).
  std::string Push(std::string_view delta, bool may_stop = true);
  // End of stream without a match: the rest of the held-back text.
  std::string Finish();

  bool stopped() const { return stopped_; }
  // The stop string that matched (when stopped()).
  const std::string& matched() const { return matched_; }
  const std::string& held() const { return held_; }
  // `may_stop`: whether the held text was pushed with may_stop (see Push).
  void Restore(std::string held, bool may_stop = true) {
    held_ = std::move(held);
    unarmed_ = may_stop ? 0 : held_.size();
  }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  size_t unarmed_ = 0;  // the first bytes of held_ were pushed with may_stop false
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_TOKENIZER_STOP_STRINGS_H_
