// Prompts for Ferry's benchmarks that no worker has seen before: ids in [100, vocab) from a
// linear congruential sequence that `key` seeds, so that a bench run can make as many distinct
// prompts as it needs and the same key gives the same prompt in every process.

#ifndef FERRY_TOOLS_BENCH_SYNTHETIC_PROMPT_H_
#define FERRY_TOOLS_BENCH_SYNTHETIC_PROMPT_H_

#include <cstdint>
#include <vector>

namespace ferry::bench {

inline std::vector<uint32_t> SyntheticPrompt(uint64_t key, int length, int64_t vocab) {
  std::vector<uint32_t> p(static_cast<size_t>(length));
  uint64_t x = key * 0x9E3779B97F4A7C15ull + 1;
  for (uint32_t& t : p) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<uint32_t>(100 + (x >> 33) % static_cast<uint64_t>(vocab - 100));
  }
  return p;
}

}  // namespace ferry::bench

#endif  // FERRY_TOOLS_BENCH_SYNTHETIC_PROMPT_H_
