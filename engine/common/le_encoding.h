// Little-endian byte encoding of the inputs of Ferry's hashes (block hashes, model fingerprint):
// the exact bytes are part of specifications that other implementations must reproduce, so the
// encoding is written out byte by byte instead of copying host memory.

#ifndef FERRY_ENGINE_COMMON_LE_ENCODING_H_
#define FERRY_ENGINE_COMMON_LE_ENCODING_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "engine/common/hash128.h"
#include "engine/common/log.h"

namespace ferry {

inline void AppendU32Le(std::string* out, uint32_t v) {
  const char bytes[4] = {static_cast<char>(v), static_cast<char>(v >> 8),
                         static_cast<char>(v >> 16), static_cast<char>(v >> 24)};
  out->append(bytes, 4);
}

inline void AppendU64Le(std::string* out, uint64_t v) {
  AppendU32Le(out, static_cast<uint32_t>(v));
  AppendU32Le(out, static_cast<uint32_t>(v >> 32));
}

// Low 64 bits, then high 64 bits.
inline void AppendHash128Le(std::string* out, const Hash128& h) {
  AppendU64Le(out, h.lo);
  AppendU64Le(out, h.hi);
}

// u32 length, then the bytes.
inline void AppendLengthPrefixed(std::string* out, absl::string_view bytes) {
  CHECK_LE(bytes.size(), uint64_t{0xffffffff});
  AppendU32Le(out, static_cast<uint32_t>(bytes.size()));
  out->append(bytes.data(), bytes.size());
}

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_LE_ENCODING_H_
