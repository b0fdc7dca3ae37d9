#include "engine/tokenizer/regex.h"

#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
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

bool IsLetter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
// Oniguruma's \s on ASCII: \t \n \v \f \r and space.
bool IsSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool IsOther(char c) { return !IsSpace(c) && !IsLetter(c) && !IsDigit(c); }

bool AllAscii(absl::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

// The GPT-2 pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// on ASCII text, alternative by alternative in the regex's order. Every character is matched by
// some alternative, so matches are contiguous.
void UnicodeRegex::FindAllGpt2Ascii(absl::string_view t,
                                    std::vector<std::pair<size_t, size_t>>* out) const {
  const size_t n = t.size();
  size_t i = 0;
  auto run = [&](size_t j, bool (*pred)(char)) {
    while (j < n && pred(t[j])) ++j;
    return j;
  };
  while (i < n) {
    size_t end = 0;
    if (t[i] == '\'' && i + 1 < n) {
      const char a = t[i + 1];
      const char b = i + 2 < n ? t[i + 2] : '\0';
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        end = i + 2;
      } else if ((a == 'r' || a == 'v') && b == 'e') {
        end = i + 3;
      } else if (a == 'l' && b == 'l') {
        end = i + 3;
      }
    }
    if (end == 0) {
      const size_t k = (t[i] == ' ' && i + 1 < n) ? i + 1 : i;  // the optional leading space
      if (IsLetter(t[k])) {
        end = run(k, IsLetter);
      } else if (IsDigit(t[k])) {
        end = run(k, IsDigit);
      } else if (IsOther(t[k])) {
        end = run(k, IsOther);
      } else {
        // Whitespace: \s+(?!\S) takes the run but leaves its last character to the next piece
        // when a non-space follows (unless that would leave nothing); otherwise \s+.
        const size_t j = run(i, IsSpace);
        end = (j < n && j - i >= 2) ? j - 1 : j;
      }
    }
    out->emplace_back(i, end);
    i = end;
  }
}

absl::Status UnicodeRegex::FindAllNumbers(absl::string_view text,
                                          std::vector<std::pair<size_t, size_t>>* out) const {
  OnigRegion* region = nullptr;
  const auto* start = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = start + text.size();
  size_t i = 0;
  absl::Status status;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (IsDigit(static_cast<char>(c))) out->emplace_back(i, i + 1);
      ++i;
      continue;
    }
    if (region == nullptr) region = onig_region_new();
    const int r =
        onig_match(static_cast<OnigRegex>(regex_), start, end, start + i, region, ONIG_OPTION_NONE);
    const size_t len = Utf8Length(c);
    if (r > 0) {
      out->emplace_back(i, i + static_cast<size_t>(r));
      i += static_cast<size_t>(r);
    } else if (r == ONIG_MISMATCH) {
      i += len;
    } else {
      status = absl::InternalError(absl::StrCat("regex match failed: ", OnigError(r, nullptr)));
      break;
    }
  }
  if (region != nullptr) onig_region_free(region, 1);
  return status;
}

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
  if (regex->pattern_ == kGpt2Pattern) regex->fast_ = Fast::kGpt2;
  if (regex->pattern_ == "\\p{N}") regex->fast_ = Fast::kNumber;
  return regex;
}

UnicodeRegex::~UnicodeRegex() {
  if (regex_ != nullptr) onig_free(static_cast<OnigRegex>(regex_));
}

absl::Status UnicodeRegex::FindAll(absl::string_view text,
                                   std::vector<std::pair<size_t, size_t>>* out) const {
  if (fast_ == Fast::kGpt2) {
    // Cut the text where no GPT-2 match can cross (a newline between a non-space and an ASCII
    // letter: the same boundaries as the tokenizer's parallel encoding), then match ASCII blocks
    // by hand and the others with Oniguruma.
    size_t block = 0;
    auto flush = [&](size_t end) -> absl::Status {
      const absl::string_view sub = text.substr(block, end - block);
      const size_t first = out->size();
      if (AllAscii(sub)) {
        FindAllGpt2Ascii(sub, out);
      } else {
        RETURN_IF_ERROR(FindAllOniguruma(sub, out));
      }
      for (size_t m = first; m < out->size(); ++m) {
        (*out)[m].first += block;
        (*out)[m].second += block;
      }
      block = end;
      return absl::OkStatus();
    };
    for (size_t i = 2; i < text.size(); ++i) {
      if (text[i - 1] == '\n' && IsLetter(text[i]) && !IsSpace(text[i - 2]) && i - block >= 256) {
        RETURN_IF_ERROR(flush(i));
      }
    }
    return flush(text.size());
  }
  if (fast_ == Fast::kNumber) return FindAllNumbers(text, out);
  return FindAllOniguruma(text, out);
}

absl::Status UnicodeRegex::FindAllOniguruma(absl::string_view text,
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
