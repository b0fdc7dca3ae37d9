#include "engine/tokenizer/normalizer.h"

#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/common/status.h"
#include "engine/tokenizer/utf8.h"
#include "utf8proc.h"

namespace ferry {
namespace {

absl::StatusOr<std::string> UnicodeForm(absl::string_view text, int options) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("normalization failed: ", utf8proc_errmsg(n)));
  }
  std::string out(reinterpret_cast<char*>(result), static_cast<size_t>(n));
  std::free(result);
  return out;
}

bool IsUnicodeWhitespace(char32_t cp) {
  // Rust's char::is_whitespace (White_Space property), which HF's Strip uses.
  return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}

}  // namespace

bool Normalizer::unicode_forms_only() const {
  for (const NormalizerStep& step : steps_) {
    if (step.kind != NormalizerStep::Kind::kNfc && step.kind != NormalizerStep::Kind::kNfd &&
        step.kind != NormalizerStep::Kind::kNfkc && step.kind != NormalizerStep::Kind::kNfkd) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::string> Normalizer::Normalize(absl::string_view text) const {
  std::string s(text);
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kNfc: {
        ASSIGN_OR_RETURN(s, UnicodeForm(s, UTF8PROC_COMPOSE));
        break;
      }
      case NormalizerStep::Kind::kNfd: {
        ASSIGN_OR_RETURN(s, UnicodeForm(s, UTF8PROC_DECOMPOSE));
        break;
      }
      case NormalizerStep::Kind::kNfkc: {
        ASSIGN_OR_RETURN(s, UnicodeForm(s, UTF8PROC_COMPOSE | UTF8PROC_COMPAT));
        break;
      }
      case NormalizerStep::Kind::kNfkd: {
        ASSIGN_OR_RETURN(s, UnicodeForm(s, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT));
        break;
      }
      case NormalizerStep::Kind::kLowercase: {
        std::string lower;
        lower.reserve(s.size());
        size_t pos = 0;
        while (pos < s.size()) {
          AppendUtf8(static_cast<char32_t>(utf8proc_tolower(NextCodePoint(s, &pos))), &lower);
        }
        s.swap(lower);
        break;
      }
      case NormalizerStep::Kind::kReplace: {
        if (step.regex == nullptr) {
          s = absl::StrReplaceAll(s, {{step.pattern, step.content}});
        } else {
          std::vector<std::pair<size_t, size_t>> matches;
          RETURN_IF_ERROR(step.regex->FindAll(s, &matches));
          std::string replaced;
          size_t at = 0;
          for (const auto& [b, e] : matches) {
            replaced.append(s, at, b - at);
            replaced.append(step.content);
            at = e;
          }
          replaced.append(s, at, std::string::npos);
          s.swap(replaced);
        }
        break;
      }
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.content);
        break;
      case NormalizerStep::Kind::kStrip: {
        size_t begin = 0, end = s.size();
        if (step.strip_left) {
          while (begin < end) {
            size_t next = begin;
            if (!IsUnicodeWhitespace(NextCodePoint(s, &next))) break;
            begin = next;
          }
        }
        if (step.strip_right) {
          while (end > begin) {
            size_t start = end - 1;
            while (start > begin && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
            size_t probe = start;
            if (!IsUnicodeWhitespace(NextCodePoint(s, &probe))) break;
            end = start;
          }
        }
        s = s.substr(begin, end - begin);
        break;
      }
    }
  }
  return s;
}

}  // namespace ferry
