// Attention's inner loops on the CPU (cpu_kernels.h): the scores of queries against keys stored
// column-wise, and the probability-weighted sum of value rows, over fp32 or bf16 KV cache rows,
// in each instruction-set variant (cpu_kernels_internal.h), all in cpu_kernels.h's canonical
// order.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "engine/backends/cpu/cpu_kernels.h"
#include "engine/backends/cpu/cpu_kernels_internal.h"
#include "engine/backends/cpu/cpu_tiles.h"
#include "engine/common/float_math.h"

namespace ferry {
namespace cpu_internal {
namespace {

inline float Widen(float f) { return f; }
inline float Widen(uint16_t b) { return Bf16ToFloat(b); }

// Calls f(std::integral_constant<int, N>{}, first) over [0, n) in tiles of kMax, the rest in one
// tile of its own size: register tiles sized at compile time for any count.
template <int N, typename F>
inline void TileRest(int64_t rest, int64_t first, F& f) {
  if constexpr (N >= 1) {
    if (rest == N) {
      f(std::integral_constant<int, N>{}, first);
    } else {
      TileRest<N - 1>(rest, first, f);
    }
  }
}
template <int kMax, typename F>
inline void ForTiles(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kMax <= n; i += kMax) f(std::integral_constant<int, kMax>{}, i);
  TileRest<kMax - 1>(n - i, i, f);
}

}  // namespace

// ---- Scalar: the definition. ----

template <typename T>
void DotColumnsScalar(const float* q, int64_t qs, int64_t queries, const T* kt, int64_t ld,
                      int64_t dims, int64_t count, float* scores, int64_t ss) {
  for (int64_t g = 0; g < queries; ++g) {
    for (int64_t j = 0; j < count; ++j) {
      float acc = 0.0f;
      for (int64_t d = 0; d < dims; ++d) acc = std::fma(q[g * qs + d], Widen(kt[d * ld + j]), acc);
      scores[g * ss + j] = acc;
    }
  }
}

template <typename T>
void WeightedRowsScalar(const float* p, int64_t ps, int64_t queries, const T* v, int64_t ld,
                        int64_t count, int64_t dims, float* acc, int64_t as) {
  for (int64_t g = 0; g < queries; ++g) {
    for (int64_t j = 0; j < count; ++j) {
      for (int64_t d = 0; d < dims; ++d) {
        acc[g * as + d] = std::fma(p[g * ps + j], Widen(v[j * ld + d]), acc[g * as + d]);
      }
    }
  }
}

// The instantiations the dispatch tables take.
template void DotColumnsScalar<float>(const float*, int64_t, int64_t, const float*, int64_t,
                                      int64_t, int64_t, float*, int64_t);
template void DotColumnsScalar<uint16_t>(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                                         int64_t, int64_t, float*, int64_t);
template void WeightedRowsScalar<float>(const float*, int64_t, int64_t, const float*, int64_t,
                                        int64_t, int64_t, float*, int64_t);
template void WeightedRowsScalar<uint16_t>(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                                           int64_t, int64_t, float*, int64_t);

#ifdef FERRY_HAVE_X86

// ---- AVX2 + FMA: 8 lanes. ----

namespace {

// Scores of N queries against 16 keys (two vectors) per pass; a ragged end of the keys goes to
// the scalar definition (AVX2 has no masked 16-bit loads).
template <int N, typename T>
FERRY_AVX2 void DotColumnsTileAvx2(const float* q, int64_t qs, const T* kt, int64_t ld,
                                   int64_t dims, int64_t count, float* scores, int64_t ss) {
  int64_t j = 0;
  for (; j + 16 <= count; j += 16) {
    __m256 a0[N], a1[N];
    FERRY_UNROLL
    for (int g = 0; g < N; ++g) a0[g] = a1[g] = _mm256_setzero_ps();
    for (int64_t d = 0; d < dims; ++d) {
      const T* row = kt + d * ld + j;
      const __m256 k0 = Load8(row), k1 = Load8(row + 8);
      FERRY_UNROLL
      for (int g = 0; g < N; ++g) {
        const __m256 qd = _mm256_broadcast_ss(q + g * qs + d);
        a0[g] = _mm256_fmadd_ps(qd, k0, a0[g]);
        a1[g] = _mm256_fmadd_ps(qd, k1, a1[g]);
      }
    }
    FERRY_UNROLL
    for (int g = 0; g < N; ++g) {
      _mm256_storeu_ps(scores + g * ss + j, a0[g]);
      _mm256_storeu_ps(scores + g * ss + j + 8, a1[g]);
    }
  }
  if (j < count) DotColumnsScalar(q, qs, N, kt + j, ld, dims, count - j, scores + j, ss);
}

}  // namespace

template <typename T>
FERRY_AVX2 void DotColumnsAvx2(const float* q, int64_t qs, int64_t queries, const T* kt, int64_t ld,
                               int64_t dims, int64_t count, float* scores, int64_t ss) {
  ForTiles<6>(queries, [&](auto n, int64_t g) {
    DotColumnsTileAvx2<decltype(n)::value>(q + g * qs, qs, kt, ld, dims, count, scores + g * ss,
                                           ss);
  });
}

// The instantiations the dispatch tables take.
template void DotColumnsAvx2<float>(const float*, int64_t, int64_t, const float*, int64_t, int64_t,
                                    int64_t, float*, int64_t);
template void DotColumnsAvx2<uint16_t>(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                                       int64_t, int64_t, float*, int64_t);

namespace {

// N queries x V vectors of 8 dims of the accumulators in registers across all keys.
template <int N, int V, typename T>
FERRY_AVX2 void WeightedRowsTileAvx2(const float* p, int64_t ps, const T* v, int64_t ld,
                                     int64_t count, float* acc, int64_t as) {
  __m256 a[N][V];
  FERRY_UNROLL
  for (int g = 0; g < N; ++g) {
    FERRY_UNROLL
    for (int i = 0; i < V; ++i) a[g][i] = _mm256_loadu_ps(acc + g * as + 8 * i);
  }
  for (int64_t j = 0; j < count; ++j) {
    __m256 x[V];
    FERRY_UNROLL
    for (int i = 0; i < V; ++i) x[i] = Load8(v + j * ld + 8 * i);
    FERRY_UNROLL
    for (int g = 0; g < N; ++g) {
      const __m256 pj = _mm256_broadcast_ss(p + g * ps + j);
      FERRY_UNROLL
      for (int i = 0; i < V; ++i) a[g][i] = _mm256_fmadd_ps(pj, x[i], a[g][i]);
    }
  }
  FERRY_UNROLL
  for (int g = 0; g < N; ++g) {
    FERRY_UNROLL
    for (int i = 0; i < V; ++i) _mm256_storeu_ps(acc + g * as + 8 * i, a[g][i]);
  }
}

template <int V, typename T>
FERRY_AVX2 void WeightedRowsChunkAvx2(const float* p, int64_t ps, int64_t queries, const T* v,
                                      int64_t ld, int64_t count, float* acc, int64_t as) {
  ForTiles<V == 4 ? 3 : 4>(queries, [&](auto n, int64_t g) {
    WeightedRowsTileAvx2<decltype(n)::value, V>(p + g * ps, ps, v, ld, count, acc + g * as, as);
  });
}

}  // namespace

template <typename T>
FERRY_AVX2 void WeightedRowsAvx2(const float* p, int64_t ps, int64_t queries, const T* v,
                                 int64_t ld, int64_t count, int64_t dims, float* acc, int64_t as) {
  int64_t d0 = 0;
  for (; d0 + 32 <= dims; d0 += 32) {
    WeightedRowsChunkAvx2<4>(p, ps, queries, v + d0, ld, count, acc + d0, as);
  }
  switch ((dims - d0) / 8) {
    case 3:
      WeightedRowsChunkAvx2<3>(p, ps, queries, v + d0, ld, count, acc + d0, as);
      break;
    case 2:
      WeightedRowsChunkAvx2<2>(p, ps, queries, v + d0, ld, count, acc + d0, as);
      break;
    case 1:
      WeightedRowsChunkAvx2<1>(p, ps, queries, v + d0, ld, count, acc + d0, as);
      break;
    default:
      break;
  }
  d0 += (dims - d0) / 8 * 8;
  if (d0 < dims) WeightedRowsScalar(p, ps, queries, v + d0, ld, count, dims - d0, acc + d0, as);
}

// The instantiations the dispatch tables take.
template void WeightedRowsAvx2<float>(const float*, int64_t, int64_t, const float*, int64_t,
                                      int64_t, int64_t, float*, int64_t);
template void WeightedRowsAvx2<uint16_t>(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                                         int64_t, int64_t, float*, int64_t);

// ---- AVX-512: 16 lanes. ----

namespace {

FERRY_AVX512 inline __m512 LoadMasked16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
FERRY_AVX512 inline __m512 LoadMasked16(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Scores of N queries against 32 keys (two vectors, masked at the ragged end) per pass.
template <int N, typename T>
FERRY_AVX512 void DotColumnsTileAvx512(const float* q, int64_t qs, const T* kt, int64_t ld,
                                       int64_t dims, int64_t count, float* scores, int64_t ss) {
  for (int64_t j = 0; j < count; j += 32) {
    const __mmask16 m0 = LaneMask(count - j), m1 = LaneMask(count - j - 16);
    __m512 a0[N], a1[N];
    FERRY_UNROLL
    for (int g = 0; g < N; ++g) a0[g] = a1[g] = _mm512_setzero_ps();
    for (int64_t d = 0; d < dims; ++d) {
      const T* row = kt + d * ld + j;
      const __m512 k0 = LoadMasked16(row, m0), k1 = LoadMasked16(row + 16, m1);
      FERRY_UNROLL
      for (int g = 0; g < N; ++g) {
        const __m512 qd = _mm512_set1_ps(q[g * qs + d]);
        a0[g] = _mm512_fmadd_ps(qd, k0, a0[g]);
        a1[g] = _mm512_fmadd_ps(qd, k1, a1[g]);
      }
    }
    FERRY_UNROLL
    for (int g = 0; g < N; ++g) {
      _mm512_mask_storeu_ps(scores + g * ss + j, m0, a0[g]);
      _mm512_mask_storeu_ps(scores + g * ss + j + 16, m1, a1[g]);
    }
  }
}

}  // namespace

template <typename T>
FERRY_AVX512 void DotColumnsAvx512(const float* q, int64_t qs, int64_t queries, const T* kt,
                                   int64_t ld, int64_t dims, int64_t count, float* scores,
                                   int64_t ss) {
  ForTiles<8>(queries, [&](auto n, int64_t g) {
    DotColumnsTileAvx512<decltype(n)::value>(q + g * qs, qs, kt, ld, dims, count, scores + g * ss,
                                             ss);
  });
}

// The instantiations the dispatch tables take.
template void DotColumnsAvx512<float>(const float*, int64_t, int64_t, const float*, int64_t,
                                      int64_t, int64_t, float*, int64_t);
template void DotColumnsAvx512<uint16_t>(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                                         int64_t, int64_t, float*, int64_t);

namespace {

// N queries x V vectors of 16 dims (the last masked to `last`) of the accumulators in registers
// across all keys.
template <int N, int V, typename T>
FERRY_AVX512 void WeightedRowsTileAvx512(const float* p, int64_t ps, const T* v, int64_t ld,
                                         int64_t count, __mmask16 last, float* acc, int64_t as) {
  __m512 a[N][V];
  FERRY_UNROLL
  for (int g = 0; g < N; ++g) {
    FERRY_UNROLL
    for (int i = 0; i < V; ++i) {
      a[g][i] = _mm512_maskz_loadu_ps(i == V - 1 ? last : 0xFFFF, acc + g * as + 16 * i);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    __m512 x[V];
    FERRY_UNROLL
    for (int i = 0; i < V; ++i) {
      x[i] = i == V - 1 ? LoadMasked16(v + j * ld + 16 * i, last) : Load16(v + j * ld + 16 * i);
    }
    FERRY_UNROLL
    for (int g = 0; g < N; ++g) {
      const __m512 pj = _mm512_set1_ps(p[g * ps + j]);
      FERRY_UNROLL
      for (int i = 0; i < V; ++i) a[g][i] = _mm512_fmadd_ps(pj, x[i], a[g][i]);
    }
  }
  FERRY_UNROLL
  for (int g = 0; g < N; ++g) {
    FERRY_UNROLL
    for (int i = 0; i < V; ++i) {
      _mm512_mask_storeu_ps(acc + g * as + 16 * i, i == V - 1 ? last : 0xFFFF, a[g][i]);
    }
  }
}

template <int V, typename T>
FERRY_AVX512 void WeightedRowsChunkAvx512(const float* p, int64_t ps, int64_t queries, const T* v,
                                          int64_t ld, int64_t count, __mmask16 last, float* acc,
                                          int64_t as) {
  ForTiles<V == 4 ? 6 : 8>(queries, [&](auto n, int64_t g) {
    WeightedRowsTileAvx512<decltype(n)::value, V>(p + g * ps, ps, v, ld, count, last, acc + g * as,
                                                  as);
  });
}

}  // namespace

template <typename T>
FERRY_AVX512 void WeightedRowsAvx512(const float* p, int64_t ps, int64_t queries, const T* v,
                                     int64_t ld, int64_t count, int64_t dims, float* acc,
                                     int64_t as) {
  for (int64_t d0 = 0; d0 < dims; d0 += 64) {
    const int64_t left = std::min<int64_t>(64, dims - d0);
    const __mmask16 last = LaneMask(left - (left - 1) / 16 * 16);
    switch ((left + 15) / 16) {
      case 4:
        WeightedRowsChunkAvx512<4>(p, ps, queries, v + d0, ld, count, last, acc + d0, as);
        break;
      case 3:
        WeightedRowsChunkAvx512<3>(p, ps, queries, v + d0, ld, count, last, acc + d0, as);
        break;
      case 2:
        WeightedRowsChunkAvx512<2>(p, ps, queries, v + d0, ld, count, last, acc + d0, as);
        break;
      default:
        WeightedRowsChunkAvx512<1>(p, ps, queries, v + d0, ld, count, last, acc + d0, as);
        break;
    }
  }
}

// The instantiations the dispatch tables take.
template void WeightedRowsAvx512<float>(const float*, int64_t, int64_t, const float*, int64_t,
                                        int64_t, int64_t, float*, int64_t);
template void WeightedRowsAvx512<uint16_t>(const float*, int64_t, int64_t, const uint16_t*, int64_t,
                                           int64_t, int64_t, float*, int64_t);

#endif  // FERRY_HAVE_X86

}  // namespace cpu_internal
}  // namespace ferry
