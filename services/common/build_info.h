// What every Ferry binary's --version prints: Ferry's version (the repository's VERSION file),
// the git commit it was built from (Bazel's workspace status, tools/workspace_status.sh; with
// "-dirty" when the tree had uncommitted changes, "unknown" outside a git checkout), and the build
// configuration (compilation mode, compiler, architecture, assertions, sanitizers).
//
// Only this library is stamped: a new commit recompiles one file and relinks the binaries.
// Thread-safe; the values are constants of the binary.

#ifndef FERRY_SERVICES_COMMON_BUILD_INFO_H_
#define FERRY_SERVICES_COMMON_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace ferry {

struct BuildInfo {
  std::string version;  // "0.1.0"
  std::string commit;   // 40 hex digits, maybe "-dirty"; or "unknown"
  std::string config;   // "opt, gcc 12.2.0, C++17, x86_64, NDEBUG, sanitizers: none"
};

const BuildInfo& GetBuildInfo();

// "PROGRAM VERSION\ncommit: COMMIT\nbuild: CONFIG\n", what --version prints.
std::string VersionText(absl::string_view program);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_BUILD_INFO_H_
