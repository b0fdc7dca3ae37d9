// The machine's arithmetic peak for Ferry's benchmarks: register-only multiply-add loops on all
// threads, the baseline that "FLOP/s against peak" ratios (engine prefill, the vision tower) are
// taken against. One definition, so every benchmark that quotes a fraction of peak quotes the same
// one.
//
// Each loop runs 12 independent accumulator chains per thread (enough to hide the FMA latency),
// `iterations` times, on fresh threads started together (not the engine's pool); the slowest
// thread's time counts and the best of 3 runs is kept. FLOPs = 2 x multiply-adds. Loops:
//   kAvx2Fma    8 fp32 multiply-adds per instruction (VFMADD, 256-bit)
//   kAvx512Fma  16 (VFMADD, 512-bit)
//   kDpbf16     32 (VDPBF16PS: the bf16 dot product Ferry's bf16 products use where the CPU has
//               AVX512-BF16)
// BestPeakFlops is the best of every loop this CPU runs (what the engine's kernels may use), so
// on a CPU with AVX512-BF16 it is the bf16 dot-product peak, twice the fp32 FMA peak.
//
// Thread-safe; each call takes ~0.1-1 s per loop of the machine's time (it uses every thread).

#ifndef FERRY_TOOLS_BENCH_PEAK_FLOPS_H_
#define FERRY_TOOLS_BENCH_PEAK_FLOPS_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace ferry::bench {

enum class PeakLoop { kAvx2Fma, kAvx512Fma, kDpbf16 };

// FLOP/s of `loop` on `threads` threads (0 where the CPU lacks it or is not x86-64).
double MeasurePeakFlops(int threads, PeakLoop loop);

struct PeakFlops {
  double flops = 0;  // FLOP/s
  PeakLoop loop = PeakLoop::kAvx2Fma;
  std::string name;  // "AVX2 FMA", "AVX-512 FMA" or "AVX512-BF16 dot product"
};

// The best of every loop this CPU supports.
PeakFlops BestPeakFlops(int threads);

// Runs fn(t) for t in [0, threads) on that many fresh threads released together; returns the
// slowest thread's seconds.
template <typename Fn>
double TimedOnThreads(int threads, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  std::vector<double> seconds(threads);
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      ++ready;
      while (!go.load()) {
      }
      const auto start = std::chrono::steady_clock::now();
      fn(t);
      seconds[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  }
  while (ready.load() < threads) {
  }
  go = true;
  for (auto& th : pool) th.join();
  return *std::max_element(seconds.begin(), seconds.end());
}

}  // namespace ferry::bench

#endif  // FERRY_TOOLS_BENCH_PEAK_FLOPS_H_
