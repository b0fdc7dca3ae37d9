#include "engine/common/status.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry {

absl::Status ErrnoStatus(int error_number, absl::string_view what) {
  char buffer[256];
  // GNU strerror_r returns the message (possibly not in buffer).
  const char* text = strerror_r(error_number, buffer, sizeof(buffer));
  return absl::Status(absl::ErrnoToStatusCode(error_number), absl::StrCat(what, ": ", text));
}

}  // namespace ferry
