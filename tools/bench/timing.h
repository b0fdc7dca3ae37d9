// Timing for Ferry's benchmark programs: the best of several runs, on the monotonic clock. The
// best (not the mean) is what the hardware can do; noise from the other core only adds time.

#ifndef FERRY_TOOLS_BENCH_TIMING_H_
#define FERRY_TOOLS_BENCH_TIMING_H_

#include <algorithm>
#include <chrono>

namespace ferry::bench {

// Seconds taken by the fastest of `reps` calls of fn().
template <typename Fn>
double BestSeconds(int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const auto end = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(end - start).count());
  }
  return best;
}

}  // namespace ferry::bench

#endif  // FERRY_TOOLS_BENCH_TIMING_H_
