// Status helpers: early-return macros for absl::Status / absl::StatusOr<T>, and errno
// conversion.
//
// Abseil 20220623 (Debian 12) has no public status macros, so Ferry defines them once, here.
// Every fallible function returns absl::Status or absl::StatusOr<T>; these macros keep the call
// sites short without ever dropping an error:
//
//   absl::Status Load(const std::string& path) {
//     RETURN_IF_ERROR(CheckReadable(path));
//     ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
//     ...
//   }
//
// Both macros evaluate their argument exactly once.

#ifndef FERRY_ENGINE_COMMON_STATUS_H_
#define FERRY_ENGINE_COMMON_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

// A Status for a failed system call: the code from absl::ErrnoToStatusCode(error_number), the
// message "<what>: <strerror text>". (This absl release has no absl::ErrnoToStatus.)
absl::Status ErrnoStatus(int error_number, absl::string_view what);

}  // namespace ferry

namespace ferry::internal {

// Lets RETURN_IF_ERROR accept both absl::Status and absl::StatusOr<T>.
inline const absl::Status& AsStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

}  // namespace ferry::internal

#define FERRY_STATUS_CONCAT_INNER_(a, b) a##b
#define FERRY_STATUS_CONCAT_(a, b) FERRY_STATUS_CONCAT_INNER_(a, b)

// Returns the error of `expr` (an absl::Status or absl::StatusOr<T>) from the enclosing
// function, which must return absl::Status or absl::StatusOr<U>.
#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    const auto& ferry_status_or_ = (expr);                     \
    if (!::ferry::internal::AsStatus(ferry_status_or_).ok()) { \
      return ::ferry::internal::AsStatus(ferry_status_or_);    \
    }                                                          \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns it from the enclosing function,
// otherwise moves the value into `lhs`, which may be a declaration (`auto x`, `T x`) or an
// existing variable. Declares a hidden local, so use it at most once per line.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  FERRY_ASSIGN_OR_RETURN_IMPL_(FERRY_STATUS_CONCAT_(ferry_statusor_, __LINE__), lhs, rexpr)

#define FERRY_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) {                                    \
    return std::move(statusor).status();                   \
  }                                                        \
  lhs = std::move(statusor).value()

#endif  // FERRY_ENGINE_COMMON_STATUS_H_
