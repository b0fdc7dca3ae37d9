// UTF-8 byte-range sequences for a range of code points, so a character class over code points
// can be matched byte by byte.
//
// Utf8Sequences(lo, hi) returns sequences of byte ranges whose union matches exactly the UTF-8
// encodings of the code points in [lo, hi] (surrogates D800-DFFF excluded: they have no UTF-8
// form). Each sequence is 1 to 4 ranges, one per byte; sequences are disjoint. The algorithm is
// the usual one (as in RE2 and Rust's regex-syntax): split the range at encoding-length
// boundaries, then until all continuation bytes of each piece span full or fixed ranges.
//
// Pure functions; thread-safe.

#ifndef FERRY_ENGINE_GRAMMAR_UTF8_RANGES_H_
#define FERRY_ENGINE_GRAMMAR_UTF8_RANGES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::grammar {

struct ByteRange {
  uint8_t lo = 0;
  uint8_t hi = 0;
};

using Utf8Sequence = std::vector<ByteRange>;

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// `lo` <= `hi` <= kMaxCodePoint.
std::vector<Utf8Sequence> Utf8Sequences(uint32_t lo, uint32_t hi);

}  // namespace ferry::grammar

#endif  // FERRY_ENGINE_GRAMMAR_UTF8_RANGES_H_
