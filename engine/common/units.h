// Parsing of the human units used in flags and config files: byte sizes ("64GiB", "512MB",
// "4096") and durations ("3d", "72h", "1h30m", "250ms").

#ifndef FERRY_ENGINE_COMMON_UNITS_H_
#define FERRY_ENGINE_COMMON_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ferry {

// A non-negative integer or decimal number followed by an optional unit: B, KB/MB/GB/TB
// (powers of 1000), KiB/MiB/GiB/TiB (powers of 1024), case-sensitive. A fractional result is
// rounded down to whole bytes. Overflow, negatives and unknown units are errors.
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);

// "1.5 GiB"-style rendering for logs and messages.
std::string FormatByteSize(uint64_t bytes);

// absl::ParseDuration's syntax ("1h30m", "250ms", "0") plus a days unit ("3d", "1d12h").
// Negative durations and "inf" are errors: Ferry's configured durations are finite and >= 0.
absl::StatusOr<absl::Duration> ParseConfigDuration(absl::string_view text);

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_UNITS_H_
