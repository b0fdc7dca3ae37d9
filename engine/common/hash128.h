// Hash128: the 128-bit hash Ferry keys caches with (block hashes, model fingerprints, image and
// file content digests), computed with XXH3-128 from libxxhash.
//
// Hex form: 32 lowercase hex digits, high half first (XXH128's canonical big-endian form, as
// printed by `xxhsum -H2` and Python's xxhash.xxh3_128_hexdigest()).

#ifndef FERRY_ENGINE_COMMON_HASH128_H_
#define FERRY_ENGINE_COMMON_HASH128_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct Hash128 {
  uint64_t lo = 0;  // XXH128_hash_t.low64
  uint64_t hi = 0;  // XXH128_hash_t.high64

  std::string ToHex() const;
  static absl::StatusOr<Hash128> FromHex(absl::string_view hex);

  friend bool operator==(const Hash128& a, const Hash128& b) {
    return a.lo == b.lo && a.hi == b.hi;
  }
  friend bool operator!=(const Hash128& a, const Hash128& b) { return !(a == b); }
  friend bool operator<(const Hash128& a, const Hash128& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
  }
  template <typename H>
  friend H AbslHashValue(H h, const Hash128& x) {
    return H::combine(std::move(h), x.lo, x.hi);
  }
};

std::ostream& operator<<(std::ostream& os, const Hash128& hash);

// XXH3-128 of `bytes` with seed 0.
Hash128 Xxh3Hash128(absl::string_view bytes);

// Incremental XXH3-128 (seed 0): the same result as Xxh3Hash128 over the concatenated input.
// Thread-compatible.
class Xxh3Hasher128 {
 public:
  Xxh3Hasher128();
  ~Xxh3Hasher128();
  Xxh3Hasher128(const Xxh3Hasher128&) = delete;
  Xxh3Hasher128& operator=(const Xxh3Hasher128&) = delete;

  void Update(absl::string_view bytes);
  Hash128 Finish() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Content digest of a whole file (XXH3-128 of its bytes), read sequentially in large chunks.
absl::StatusOr<Hash128> DigestFile(const std::string& path);

}  // namespace ferry

#endif  // FERRY_ENGINE_COMMON_HASH128_H_
