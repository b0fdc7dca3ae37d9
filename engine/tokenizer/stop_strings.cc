#include "engine/tokenizer/stop_strings.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status StopStringMatcher::Validate(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(
        absl::StrCat("stop: at most ", kMaxStopStrings, " strings (got ", stops.size(), ")"));
  }
  for (const std::string& s : stops) {
    if (s.empty()) return absl::InvalidArgumentError("stop: strings must not be empty");
    if (s.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop: each string is at most ", kMaxStopStringBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

std::string StopStringMatcher::Push(std::string_view delta, bool may_stop) {
  if (stopped_) return "";
  held_.append(delta);
  if (!may_stop) unarmed_ = held_.size();
  // The earliest occurrence of any stop string that ends in text that may stop (the longest one
  // among those starting there).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    if (!may_stop) break;
    const size_t from = unarmed_ >= s.size() ? unarmed_ - s.size() + 1 : 0;
    const size_t at = held_.find(s, from);
    if (at != std::string::npos &&
        (first == std::string::npos || at < first || (at == first && s.size() > matched_.size()))) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  const size_t released = held_.size() - keep;
  std::string out = held_.substr(0, released);
  held_.erase(0, released);
  unarmed_ = unarmed_ > released ? unarmed_ - released : 0;
  return out;
}

std::string StopStringMatcher::Finish() {
  if (stopped_) return "";
  std::string out;
  out.swap(held_);
  unarmed_ = 0;
  return out;
}

}  // namespace ferry
