// Deterministic test bytes for the KV transport's multi-process tests: the byte at offset `o` of
// a region filled with seed `s` is a function of (s, o) alone, so a test can compute what any
// range of a peer's region holds without seeing the region. Used by transfer_peer (the process
// that fills its memory) and kv_transport_process_test (which checks what it read).

#ifndef FERRY_SERVICES_TRANSFER_TRANSFER_TEST_PATTERN_H_
#define FERRY_SERVICES_TRANSFER_TRANSFER_TEST_PATTERN_H_

#include <cstddef>
#include <cstdint>

namespace ferry {
namespace transfer {

// SplitMix64 of the seed and the word index: the pattern's 8-byte word number `index`.
inline uint64_t PatternWord(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + index + 1;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The pattern's byte at `offset`: byte offset % 8 (little-endian) of word offset / 8.
inline uint8_t PatternByte(uint64_t seed, uint64_t offset) {
  return static_cast<uint8_t>(PatternWord(seed, offset / 8) >> (8 * (offset % 8)));
}

// Writes the pattern's bytes [offset, offset + length) to out[0, length).
inline void FillPattern(uint64_t seed, uint64_t offset, uint8_t* out, size_t length) {
  size_t i = 0;
  while (i < length && (offset + i) % 8 != 0) {
    out[i] = PatternByte(seed, offset + i);
    ++i;
  }
  for (; i + 8 <= length; i += 8) {
    const uint64_t word = PatternWord(seed, (offset + i) / 8);
    for (int b = 0; b < 8; ++b) out[i + b] = static_cast<uint8_t>(word >> (8 * b));
  }
  for (; i < length; ++i) out[i] = PatternByte(seed, offset + i);
}

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_TRANSFER_TEST_PATTERN_H_
