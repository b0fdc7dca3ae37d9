// The crash tests' objects: object i of writer run `run` has a key and bytes that anyone can
// recompute from (run, i), so a checker knows exactly what every acknowledged or merely
// attempted object must contain.

#ifndef FERRY_KVSTORE_CRASH_OBJECTS_H_
#define FERRY_KVSTORE_CRASH_OBJECTS_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>

#include "engine/common/hash128.h"
#include "kvstore/format.h"

namespace ferry {
namespace kv {
namespace crash {

inline Hash128 ObjectKey(uint64_t run, uint64_t i) {
  return Xxh3Hash128("crash/" + std::to_string(run) + "/" + std::to_string(i));
}

// 1 KiB .. 33 KiB: dozens per 1 MiB segment, records of 1 to 9 pages.
inline size_t ObjectBytes(uint64_t run, uint64_t i) {
  return 1024 + static_cast<size_t>(ObjectKey(run, i).lo % (32 << 10));
}

inline std::string ObjectValue(uint64_t run, uint64_t i) {
  std::string v(ObjectBytes(run, i), '\0');
  std::mt19937_64 rng(ObjectKey(run, i).hi);
  for (size_t j = 0; j < v.size(); j += 8) {
    const uint64_t r = rng();
    std::memcpy(&v[j], &r, std::min<size_t>(8, v.size() - j));
  }
  return v;
}

inline ObjectMeta ObjectMetaFor(uint64_t run) {
  ObjectMeta m;
  m.fingerprint = Xxh3Hash128("crash model");
  m.layout_tag = run;
  m.token_count = 64;
  m.traffic_class = run % 2 ? TrafficClass::kAgent : TrafficClass::kChat;
  return m;
}

}  // namespace crash
}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_CRASH_OBJECTS_H_
