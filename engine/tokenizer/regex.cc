#include "engine/tokenizer/regex.h"

#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "oniguruma.h"

namespace ferry {
namespace {

void InitializeOnigurumaOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string OnigError(int code, OnigErrorInfo* info) {
  OnigUChar buffer[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info != nullptr ? onig_error_code_to_str(buffer, code, info)
                                : onig_error_code_to_str(buffer, code);
  return std::string(reinterpret_cast<const char*>(buffer), n > 0 ? n : 0);
}

// Length of the UTF-8 sequence that starts with `lead` (1 for invalid lead bytes).
size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xe) return 3;
  if ((lead >> 3) == 0x1e) return 4;
  return 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<UnicodeRegex>> UnicodeRegex::Compile(absl::string_view pattern) {
  InitializeOnigurumaOnce();
  auto regex = std::unique_ptr<UnicodeRegex>(new UnicodeRegex());
  regex->pattern_ = std::string(pattern);
  OnigRegex compiled = nullptr;
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(regex->pattern_.data());
  const int rc = onig_new(&compiled, begin, begin + regex->pattern_.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_RUBY, &info);
  if (rc != ONIG_NORMAL) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad pre-tokenizer regex /", pattern, "/: ", OnigError(rc, &info)));
  }
  regex->regex_ = compiled;
  return regex;
}

UnicodeRegex::~UnicodeRegex() {
  if (regex_ != nullptr) onig_free(static_cast<OnigRegex>(regex_));
}

absl::Status UnicodeRegex::FindAll(absl::string_view text,
                                   std::vector<std::pair<size_t, size_t>>* out) const {
  OnigRegion* region = onig_region_new();
  const auto* start = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = start + text.size();
  size_t pos = 0;
  absl::Status status;
  while (pos <= text.size()) {
    const int r = onig_search(static_cast<OnigRegex>(regex_), start, end, start + pos, end, region,
                              ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) {
      status = absl::InternalError(absl::StrCat("regex search failed: ", OnigError(r, nullptr)));
      break;
    }
    const size_t match_begin = static_cast<size_t>(region->beg[0]);
    const size_t match_end = static_cast<size_t>(region->end[0]);
    if (match_end > match_begin) {
      out->emplace_back(match_begin, match_end);
      pos = match_end;
    } else {
      if (match_begin >= text.size()) break;
      pos = match_begin + Utf8Length(static_cast<unsigned char>(text[match_begin]));
    }
  }
  onig_region_free(region, 1);
  return status;
}

}  // namespace ferry
