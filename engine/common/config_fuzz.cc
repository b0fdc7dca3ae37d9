// Fuzz target for config parsing and the typed readers: any input either fails to parse with a
// Status or yields a Config whose readers return values or Statuses, never a crash.

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/common/config.h"

namespace {

void Exercise(const ferry::Config& config, int depth) {
  for (const std::string& key : config.Keys()) {
    bool b;
    int32_t i32;
    int64_t i64;
    uint32_t u32;
    uint64_t u64;
    double d;
    std::string s;
    std::vector<std::string> strings;
    absl::Duration duration;
    (void)config.Read(key, &b);
    (void)config.Read(key, &i32);
    (void)config.Read(key, &i64);
    (void)config.Read(key, &u32);
    (void)config.Read(key, &u64);
    (void)config.Read(key, &d);
    (void)config.Read(key, &s);
    (void)config.Read(key, &strings);
    (void)config.ReadByteSize(key, &u64);
    (void)config.ReadDuration(key, &duration);
    if (depth < 8) {
      auto child = config.Child(key);
      if (child.ok()) Exercise(*child, depth + 1);
      auto children = config.Children(key);
      if (children.ok()) {
        for (const ferry::Config& c : *children) Exercise(c, depth + 1);
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ferry::Config::Parse(text, "fuzz.json");
  if (!config.ok()) return 0;
  Exercise(*config, 0);
  (void)config->CheckAllKeysUsed();
  return 0;
}
