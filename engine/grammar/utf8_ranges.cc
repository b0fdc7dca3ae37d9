#include "engine/grammar/utf8_ranges.h"

#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/utf8.h"

namespace ferry::grammar {

std::vector<Utf8Sequence> Utf8Sequences(uint32_t lo, uint32_t hi) {
  std::vector<Utf8Sequence> out;
  std::vector<std::pair<uint32_t, uint32_t>> work;
  // Surrogates first, then in reverse so pieces come out in ascending order.
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (hi > 0xDFFF) work.push_back({0xE000, hi});
    if (lo < 0xD800) work.push_back({lo, 0xD7FF});
  } else {
    work.push_back({lo, hi});
  }
  static constexpr uint32_t kMaxForLength[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  while (!work.empty()) {
    auto [a, b] = work.back();
    work.pop_back();
    // Split at encoding-length boundaries.
    bool split = false;
    for (uint32_t max : kMaxForLength) {
      if (a <= max && b > max) {
        work.push_back({max + 1, b});
        work.push_back({a, max});
        split = true;
        break;
      }
    }
    if (split) continue;
    if (b <= 0x7F) {
      out.push_back({{static_cast<uint8_t>(a), static_cast<uint8_t>(b)}});
      continue;
    }
    // Split until each continuation byte range is independent of the ones before it.
    for (int i = 1; i < 4; ++i) {
      uint32_t m = (uint32_t{1} << (6 * i)) - 1;
      if ((a & ~m) != (b & ~m)) {
        if ((a & m) != 0) {
          work.push_back({(a | m) + 1, b});
          work.push_back({a, a | m});
          split = true;
          break;
        }
        if ((b & m) != m) {
          work.push_back({b & ~m, b});
          work.push_back({a, (b & ~m) - 1});
          split = true;
          break;
        }
      }
    }
    if (split) continue;
    std::string sa, sb;
    AppendUtf8(a, &sa);
    AppendUtf8(b, &sb);
    Utf8Sequence seq;
    for (size_t i = 0; i < sa.size(); ++i) {
      seq.push_back({static_cast<uint8_t>(sa[i]), static_cast<uint8_t>(sb[i])});
    }
    out.push_back(std::move(seq));
  }
  return out;
}

}  // namespace ferry::grammar
