// ferry bench block_hash: the cost of chained block hashing, which the router pays on every
// request (a coding-agent prompt of ~16K tokens is ~250 blocks of 64).
//
// Baselines measured in the same run, on the same bytes: one XXH3-128 call over the whole token
// buffer (the floor: hashing with no chaining or encoding) and memcpy. Prints a table, then one
// JSON line.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/common/block_hash.h"
#include "engine/common/hash128.h"
#include "tools/bench/timing.h"

using ferry::bench::BestSeconds;

int main() {
  constexpr size_t kTokens = 16384;
  constexpr uint32_t kBlock = 64;
  constexpr int kInner = 200;  // prompts per timed run
  constexpr int kReps = 7;

  std::mt19937 rng(1);
  std::vector<ferry::TokenId> tokens(kTokens);
  for (auto& t : tokens) t = rng() % 49152;
  const ferry::BlockHashScope scope{ferry::Xxh3Hash128("bench model"), "tenant", ""};
  const std::string bytes(reinterpret_cast<const char*>(tokens.data()), kTokens * 4);
  std::string copy(bytes.size(), '\0');

  volatile uint64_t sink = 0;
  const double chain =
      BestSeconds(kReps,
                  [&] {
                    for (int i = 0; i < kInner; ++i) {
                      sink += ferry::ComputeBlockHashes(scope, tokens, kBlock).back().lo;
                    }
                  }) /
      kInner;
  const double raw = BestSeconds(kReps,
                                 [&] {
                                   for (int i = 0; i < kInner; ++i)
                                     sink += ferry::Xxh3Hash128(bytes).lo;
                                 }) /
                     kInner;
  const double memcpy_s = BestSeconds(kReps,
                                      [&] {
                                        for (int i = 0; i < kInner; ++i) {
                                          std::memcpy(copy.data(), bytes.data(), bytes.size());
                                          sink += static_cast<unsigned char>(copy[i % copy.size()]);
                                        }
                                      }) /
                          kInner;

  const double gb = bytes.size() / 1e9;
  std::printf("block hashing, %zu-token prompt, B=%u (%zu blocks), best of %d x %d\n", kTokens,
              kBlock, kTokens / kBlock, kReps, kInner);
  std::printf("  %-28s %10.1f us/prompt %8.2f GB/s %8.1f Mtok/s\n", "chained block hashes",
              chain * 1e6, gb / chain, kTokens / chain / 1e6);
  std::printf("  %-28s %10.1f us/prompt %8.2f GB/s\n", "baseline: one XXH3-128", raw * 1e6,
              gb / raw);
  std::printf("  %-28s %10.1f us/prompt %8.2f GB/s\n", "baseline: memcpy", memcpy_s * 1e6,
              gb / memcpy_s);
  std::printf("  chained / raw XXH3 throughput: %.2f\n", raw / chain);
  std::printf(
      "{\"bench\":\"block_hash\",\"prompt_tokens\":%zu,\"block_tokens\":%u,"
      "\"us_per_prompt\":%.2f,\"tokens_per_s\":%.0f,\"xxh3_gb_per_s\":%.2f,"
      "\"memcpy_gb_per_s\":%.2f,\"ratio_vs_raw_xxh3\":%.3f}\n",
      kTokens, kBlock, chain * 1e6, kTokens / chain, gb / raw, gb / memcpy_s, raw / chain);
  return sink == 42 ? 1 : 0;  // keeps `sink` alive; never 42 in practice
}
