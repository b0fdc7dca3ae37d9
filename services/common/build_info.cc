#include "services/common/build_info.h"

#include "absl/strings/str_cat.h"
#include "services/common/build_stamp.inc"  // FERRY_VERSION, FERRY_GIT_COMMIT (a genrule's)

#ifndef FERRY_COMPILATION_MODE
#define FERRY_COMPILATION_MODE "unknown"
#endif

namespace ferry {
namespace {

std::string Compiler() {
#if defined(__clang__)
  return absl::StrCat("clang ", __clang_major__, ".", __clang_minor__, ".", __clang_patchlevel__);
#elif defined(__GNUC__)
  return absl::StrCat("gcc ", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__);
#else
  return "unknown compiler";
#endif
}

bool HasFeature(bool clang_feature, bool gcc_macro) { return clang_feature || gcc_macro; }

std::string Sanitizers() {
#if defined(__has_feature)
#define FERRY_HAS_FEATURE(x) __has_feature(x)
#else
#define FERRY_HAS_FEATURE(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__)
  constexpr bool kGccAsan = true;
#else
  constexpr bool kGccAsan = false;
#endif
#if defined(__SANITIZE_THREAD__)
  constexpr bool kGccTsan = true;
#else
  constexpr bool kGccTsan = false;
#endif
  std::string out;
  if (HasFeature(FERRY_HAS_FEATURE(address_sanitizer), kGccAsan)) out = "address";
  if (HasFeature(FERRY_HAS_FEATURE(thread_sanitizer), kGccTsan)) {
    out = out.empty() ? "thread" : out + "+thread";
  }
#undef FERRY_HAS_FEATURE
  return out.empty() ? "none" : out;
}

BuildInfo Make() {
  BuildInfo info;
  info.version = FERRY_VERSION;
  info.commit = FERRY_GIT_COMMIT;
  info.config =
      absl::StrCat(FERRY_COMPILATION_MODE, ", ", Compiler(), ", C++", __cplusplus / 100 % 100,
#if defined(__x86_64__)
                   ", x86_64",
#elif defined(__aarch64__)
                   ", aarch64",
#endif
#if defined(NDEBUG)
                   ", NDEBUG",
#endif
#if defined(__FAST_MATH__)
                   ", fast-math",
#endif
                   ", sanitizers: ", Sanitizers());
  return info;
}

}  // namespace

const BuildInfo& GetBuildInfo() {
  static const BuildInfo* const info = new BuildInfo(Make());
  return *info;
}

std::string VersionText(absl::string_view program) {
  const BuildInfo& info = GetBuildInfo();
  return absl::StrCat(program, " ", info.version, "\ncommit: ", info.commit,
                      "\nbuild: ", info.config, "\n");
}

}  // namespace ferry
