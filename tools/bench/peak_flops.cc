#include "tools/bench/peak_flops.h"

#include <cstdint>

#include "engine/backends/cpu/cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ferry::bench {
namespace {

volatile double g_sink = 0;

#if defined(__x86_64__)
// 12 independent FMA chains per thread, `iterations` times: 2 * 12 * lanes FLOPs per iteration.
// The chains must live in registers: without the unroll pragma GCC keeps a[] in memory and the
// loop runs at half the machine's rate (a baseline that would flatter every ratio).
__attribute__((target("avx2,fma"))) float FmaLoopAvx2(int64_t iterations) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(1.0f + i * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f,fma"))) float FmaLoopAvx512(int64_t iterations) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

// The bf16 dot-product rate (VDPBF16PS: 32 multiply-adds per instruction), which Ferry's bf16
// products use where the CPU has it: 12 independent chains.
__attribute__((target("avx512f,avx512bf16"))) float DpbfLoop(int64_t iterations) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(1.0f + i * 1e-3f);
  const __m512bh x = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));
  const __m512bh y = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));
  for (int64_t it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}
#endif

bool Supported(PeakLoop loop) {
#if defined(__x86_64__)
  switch (loop) {
    case PeakLoop::kAvx2Fma:
      return CpuSupports(CpuIsa::kAvx2);
    case PeakLoop::kAvx512Fma:
      return CpuSupports(CpuIsa::kAvx512);
    case PeakLoop::kDpbf16:
      return CpuSupports(CpuIsa::kAvx512Bf16);
  }
#endif
  return false;
}

}  // namespace

double MeasurePeakFlops(int threads, PeakLoop loop) {
  if (!Supported(loop)) return 0;
  const int64_t iterations = 50'000'000;
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    best = std::min(best, TimedOnThreads(threads, [&](int) {
#if defined(__x86_64__)
                      g_sink = g_sink + (loop == PeakLoop::kAvx2Fma     ? FmaLoopAvx2(iterations)
                                         : loop == PeakLoop::kAvx512Fma ? FmaLoopAvx512(iterations)
                                                                        : DpbfLoop(iterations));
#endif
                    }));
  }
  const double macs = loop == PeakLoop::kAvx2Fma ? 8 : loop == PeakLoop::kAvx512Fma ? 16 : 32;
  return 2.0 * 12 * macs * iterations * threads / best;
}

PeakFlops BestPeakFlops(int threads) {
  PeakFlops best;
  const std::pair<PeakLoop, const char*> loops[] = {{PeakLoop::kAvx2Fma, "AVX2 FMA"},
                                                    {PeakLoop::kAvx512Fma, "AVX-512 FMA"},
                                                    {PeakLoop::kDpbf16, "AVX512-BF16 dot product"}};
  for (const auto& [loop, name] : loops) {
    const double flops = MeasurePeakFlops(threads, loop);
    if (flops > best.flops) best = {flops, loop, name};
  }
  return best;
}

}  // namespace ferry::bench
