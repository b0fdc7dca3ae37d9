#include "engine/common/units.h"

#include <cmath>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view input = absl::StripAsciiWhitespace(text);
  size_t number_end = 0;
  while (number_end < input.size() &&
         (absl::ascii_isdigit(input[number_end]) || input[number_end] == '.')) {
    ++number_end;
  }
  const absl::string_view number = input.substr(0, number_end);
  const absl::string_view unit = absl::StripLeadingAsciiWhitespace(input.substr(number_end));
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid byte size '", text, "': ", why, " (examples: 4096, 512MB, 64GiB)"));
  };
  if (number.empty()) return error("expected a number");

  uint64_t multiplier = 1;
  if (unit.empty() || unit == "B") {
    multiplier = 1;
  } else if (unit == "KB") {
    multiplier = 1000ull;
  } else if (unit == "MB") {
    multiplier = 1000ull * 1000;
  } else if (unit == "GB") {
    multiplier = 1000ull * 1000 * 1000;
  } else if (unit == "TB") {
    multiplier = 1000ull * 1000 * 1000 * 1000;
  } else if (unit == "KiB") {
    multiplier = 1ull << 10;
  } else if (unit == "MiB") {
    multiplier = 1ull << 20;
  } else if (unit == "GiB") {
    multiplier = 1ull << 30;
  } else if (unit == "TiB") {
    multiplier = 1ull << 40;
  } else {
    return error(absl::StrCat("unknown unit '", unit, "'"));
  }

  if (number.find('.') == absl::string_view::npos) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(number, &value)) return error("number out of range");
    if (value > std::numeric_limits<uint64_t>::max() / multiplier) return error("too large");
    return value * multiplier;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !std::isfinite(value)) return error("bad number");
  const long double bytes = static_cast<long double>(value) * multiplier;
  if (bytes >= 18446744073709551616.0L) return error("too large");
  return static_cast<uint64_t>(bytes);
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

absl::StatusOr<absl::Duration> ParseConfigDuration(absl::string_view text) {
  const absl::string_view input = absl::StripAsciiWhitespace(text);
  auto error = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid duration '", text, "': ", why, " (examples: 3d, 72h, 1h30m, 250ms)"));
  };
  if (input.empty()) return error("empty");
  if (input[0] == '-') return error("negative");
  // A leading "<integer>d" is days; absl parses the rest.
  absl::Duration days = absl::ZeroDuration();
  absl::string_view rest = input;
  size_t digits = 0;
  while (digits < rest.size() && absl::ascii_isdigit(rest[digits])) ++digits;
  if (digits > 0 && digits < rest.size() && rest[digits] == 'd') {
    int64_t count = 0;
    if (!absl::SimpleAtoi(rest.substr(0, digits), &count) || count > 1'000'000) {
      return error("too many days");
    }
    days = absl::Hours(24 * count);
    rest.remove_prefix(digits + 1);
    if (rest.empty()) return days;
  }
  absl::Duration remainder;
  if (!absl::ParseDuration(std::string(rest), &remainder)) return error("not a duration");
  if (remainder == absl::InfiniteDuration()) return error("must be finite");
  if (remainder < absl::ZeroDuration()) return error("negative");
  return days + remainder;
}

}  // namespace ferry
