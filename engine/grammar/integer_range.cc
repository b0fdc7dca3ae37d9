#include "engine/grammar/integer_range.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ferry::grammar {
namespace {

std::string DigitClass(char lo, char hi) {
  if (lo == hi) return absl::StrCat("\"", std::string(1, lo), "\"");
  if (lo == '0' && hi == '9') return "[0-9]";
  return absl::StrCat("[", std::string(1, lo), "-", std::string(1, hi), "]");
}

std::string AnyDigits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return absl::StrCat("[0-9]{", n, "}");
}

// Digit strings of equal length between lo and hi (lo <= hi), as alternatives appended to out
// (each a sequence prefixed by `prefix`).
void SameLength(const std::string& prefix, const std::string& lo, const std::string& hi,
                std::vector<std::string>* out) {
  if (lo.empty()) {
    out->push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  const size_t rest = lo.size() - 1;
  const std::string lo_rest = lo.substr(1), hi_rest = hi.substr(1);
  const bool lo_rest_min = lo_rest.find_first_not_of('0') == std::string::npos;
  const bool hi_rest_max = hi_rest.find_first_not_of('9') == std::string::npos;
  auto join = [&](const std::string& a, const std::string& b) {
    if (a.empty()) return b;
    if (b.empty()) return a;
    return absl::StrCat(a, " ", b);
  };
  if (lo[0] == hi[0]) {
    SameLength(join(prefix, DigitClass(lo[0], lo[0])), lo_rest, hi_rest, out);
    return;
  }
  if (lo_rest_min && hi_rest_max) {
    out->push_back(join(join(prefix, DigitClass(lo[0], hi[0])), AnyDigits(rest)));
    return;
  }
  char mid_lo = lo[0] + 1, mid_hi = hi[0] - 1;
  if (lo_rest_min) {
    mid_lo = lo[0];
  } else {
    SameLength(join(prefix, DigitClass(lo[0], lo[0])), lo_rest, std::string(rest, '9'), out);
  }
  const bool hi_separate = !hi_rest_max;
  if (!hi_separate) mid_hi = hi[0];
  if (mid_lo <= mid_hi)
    out->push_back(join(join(prefix, DigitClass(mid_lo, mid_hi)), AnyDigits(rest)));
  if (hi_separate) {
    SameLength(join(prefix, DigitClass(hi[0], hi[0])), std::string(rest, '0'), hi_rest, out);
  }
}

std::string Pow10Minus1(size_t digits) { return std::string(digits, '9'); }
std::string Pow10(size_t digits) {  // 10^(digits-1): the smallest number with `digits` digits
  return digits == 1 ? "0" : absl::StrCat("1", std::string(digits - 1, '0'));
}

// Non-negative integers in [lo, hi] (hi absent: unbounded); lo <= hi.
void NonNegative(uint64_t lo, std::optional<uint64_t> hi, std::vector<std::string>* out) {
  const std::string lo_s = std::to_string(lo);
  const size_t max_len = hi ? std::to_string(*hi).size() : lo_s.size();
  for (size_t len = lo_s.size(); len <= max_len; ++len) {
    const std::string a = len == lo_s.size() ? lo_s : Pow10(len);
    const std::string b = hi && len == max_len ? std::to_string(*hi) : Pow10Minus1(len);
    SameLength("", a, b, out);
  }
  if (!hi) out->push_back(absl::StrCat("[1-9] [0-9]{", lo_s.size(), ",}"));
}

}  // namespace

std::string IntegerRangeGbnf(std::optional<int64_t> min, std::optional<int64_t> max) {
  std::vector<std::string> alternatives;
  // Negative part: -(magnitudes in [max(1, -max), -min]).
  if (!min || *min < 0) {
    const uint64_t mag_lo = max && *max < 0 ? static_cast<uint64_t>(-(*max + 1)) + 1 : 1;
    std::optional<uint64_t> mag_hi;
    if (min) mag_hi = static_cast<uint64_t>(-(*min + 1)) + 1;
    std::vector<std::string> mags;
    NonNegative(mag_lo, mag_hi, &mags);
    alternatives.push_back(absl::StrCat("\"-\" (", absl::StrJoin(mags, " | "), ")"));
  }
  if (!max || *max >= 0) {
    const uint64_t lo = min && *min > 0 ? static_cast<uint64_t>(*min) : 0;
    std::optional<uint64_t> hi;
    if (max) hi = static_cast<uint64_t>(*max);
    NonNegative(lo, hi, &alternatives);
  }
  return absl::StrCat("(", absl::StrJoin(alternatives, " | "), ")");
}

}  // namespace ferry::grammar
