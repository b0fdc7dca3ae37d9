#include "engine/backends/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/backends/cpu/cpu_tiles.h"
#include "engine/common/float_math.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define FERRY_HAVE_X86 1
#endif

namespace ferry {

using cpu_internal::ForPanelTiles;
using cpu_internal::StoreColumns;
#ifdef FERRY_HAVE_X86
using cpu_internal::StoreTile512;
#endif

void PackPanels(const float* w, int64_t n, int64_t k, float* packed) {
  const int64_t panels = (n + kPanel - 1) / kPanel;
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = packed + p * kPanel * k;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t c = 0; c < kPanel; ++c) {
        const int64_t row = p * kPanel + c;
        dst[kk * kPanel + c] = row < n ? w[row * k + kk] : 0.0f;
      }
    }
  }
}

void PackPanelsBf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed) {
  const int64_t panels = (n + kPanel - 1) / kPanel, k2 = PairedK(k);
  for (int64_t p = 0; p < panels; ++p) {
    uint16_t* dst = packed + p * kPanel * k2;
    for (int64_t i = 0; i < k2 / 2; ++i) {
      for (int64_t c = 0; c < kPanel; ++c) {
        const int64_t row = p * kPanel + c;
        for (int64_t half = 0; half < 2; ++half) {
          const int64_t kk = 2 * i + half;
          dst[(i * kPanel + c) * 2 + half] = row < n && kk < k ? w[row * k + kk] : 0;
        }
      }
    }
  }
}

void RoundActivationsBf16(const float* x, int64_t k, uint16_t* out) {
  for (int64_t i = 0; i < k; ++i) out[i] = FloatToBf16(x[i]);
  if (k % 2 != 0) out[k] = 0;
}

namespace {
// Elements [from, k) of RoundActivationsBf16, and its padding.
void RoundActivationsBf16Tail(const float* x, int64_t from, int64_t k, uint16_t* out) {
  for (int64_t i = from; i < k; ++i) out[i] = FloatToBf16(x[i]);
  if (k % 2 != 0) out[k] = 0;
}
}  // namespace

namespace {

inline float Widen(float f) { return f; }
inline float Widen(uint16_t b) { return Bf16ToFloat(b); }

// The fixed combination tree of the 16 partial sums of SumSquares.
inline float ReduceLanes(float* a) {
  for (int j = 0; j < 8; ++j) a[j] += a[j + 8];
  for (int j = 0; j < 4; ++j) a[j] += a[j + 4];
  for (int j = 0; j < 2; ++j) a[j] += a[j + 2];
  return a[0] + a[1];
}

// Subnormal inputs read as zero and subnormal results flushed to zero while alive, as
// VDPBF16PS always computes (x86 only; elsewhere a no-op).
class FlushDenormals {
 public:
#ifdef FERRY_HAVE_X86
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

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

// ---- Scalar: the definition. ----

void GemmBf16Scalar(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                    const uint16_t* packed, int64_t p0, int64_t p1, int64_t n, float* out,
                    int64_t os) {
  FlushDenormals flush;
  for (int64_t m = 0; m < rows; ++m) {
    const uint16_t* x = xb + m * xs;
    for (int64_t p = p0; p < p1; ++p) {
      const uint16_t* panel = packed + p * kPanel * k2;
      float tile[kPanel];
      for (int64_t c = 0; c < kPanel; ++c) {
        float acc = 0.0f;
        for (int64_t i = 0; i < k2 / 2; ++i) {
          const uint16_t* w = panel + (i * kPanel + c) * 2;
          acc = std::fma(Bf16ToFloat(x[2 * i + 1]), Bf16ToFloat(w[1]), acc);
          acc = std::fma(Bf16ToFloat(x[2 * i]), Bf16ToFloat(w[0]), acc);
        }
        tile[c] = acc;
      }
      StoreColumns(tile, p * kPanel, n, out + m * os);
    }
  }
}

void GemmScalar(const float* x, int64_t xs, int64_t rows, int64_t k, const float* packed,
                int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t p = p0; p < p1; ++p) {
      const float* panel = packed + p * kPanel * k;
      float tile[kPanel];
      for (int64_t c = 0; c < kPanel; ++c) {
        float acc = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk) {
          acc = std::fma(x[m * xs + kk], panel[kk * kPanel + c], acc);
        }
        tile[c] = acc;
      }
      StoreColumns(tile, p * kPanel, n, out + m * os);
    }
  }
}

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

float ScaleMaxScalar(float* x, int64_t n, float scale) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    x[i] = x[i] * scale;
    m = x[i] > m ? x[i] : m;
  }
  return m;
}

float ExpSumScalar(float* x, int64_t n, float sub) {
  float a[16] = {};
  for (int64_t i = 0; i < n; ++i) {
    x[i] = Exp(x[i] - sub);
    a[i % 16] += x[i];
  }
  return ReduceLanes(a);
}

float SumSquaresScalar(const float* x, int64_t n) {
  float a[16] = {};
  for (int64_t i = 0; i < n; ++i) a[i % 16] = std::fma(x[i], x[i], a[i % 16]);
  return ReduceLanes(a);
}

void SiluMulScalar(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = (g[i] / (1.0f + Exp(-g[i]))) * u[i];
}

const CpuKernels kScalarKernels = {GemmScalar,
                                   GemmBf16Scalar,
                                   DotColumnsScalar<float>,
                                   DotColumnsScalar<uint16_t>,
                                   WeightedRowsScalar<float>,
                                   WeightedRowsScalar<uint16_t>,
                                   ScaleMaxScalar,
                                   ExpSumScalar,
                                   RoundActivationsBf16,
                                   SumSquaresScalar,
                                   SiluMulScalar};

#ifdef FERRY_HAVE_X86

// ---- AVX2 + FMA: 8 lanes; a panel is two vectors. ----

#define FERRY_AVX2 __attribute__((target("avx2,fma")))

FERRY_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
FERRY_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// MR rows x NP panels of 16 columns, the whole k range.
template <int MR, int NP, typename T>
FERRY_AVX2 inline void TileAvx2(const float* x, int64_t xs, int64_t k, const T* panel0,
                                int64_t panel_stride, int64_t first_col, int64_t n, float* out,
                                int64_t os) {
  __m256 acc[MR][NP][2];
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const T* b = panel0 + p * panel_stride + kk * kPanel;
      const __m256 b0 = Load8(b), b1 = Load8(b + 8);
      FERRY_UNROLL
      for (int r = 0; r < MR; ++r) {
        const __m256 xr = _mm256_broadcast_ss(x + r * xs + kk);
        acc[r][p][0] = _mm256_fmadd_ps(xr, b0, acc[r][p][0]);
        acc[r][p][1] = _mm256_fmadd_ps(xr, b1, acc[r][p][1]);
      }
    }
  }
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const int64_t col = first_col + p * kPanel;
      if (col + kPanel <= n) {
        _mm256_storeu_ps(out + r * os + col, acc[r][p][0]);
        _mm256_storeu_ps(out + r * os + col + 8, acc[r][p][1]);
      } else {
        alignas(32) float tile[kPanel];
        _mm256_store_ps(tile, acc[r][p][0]);
        _mm256_store_ps(tile + 8, acc[r][p][1]);
        StoreColumns(tile, col, n, out + r * os);
      }
    }
  }
}

// MR rows over panels [p0, p1) in tiles of NP panels (ForPanelTiles).
template <int MR, int NP, typename T>
FERRY_AVX2 void RowsAvx2(const float* x, int64_t xs, int64_t k, const T* packed, int64_t p0,
                         int64_t p1, int64_t n, float* out, int64_t os) {
  const int64_t ps = kPanel * k;
  ForPanelTiles<NP>(p0, p1, [&](auto np, int64_t p) {
    TileAvx2<MR, decltype(np)::value>(x, xs, k, packed + p * ps, ps, p * kPanel, n, out, os);
  });
}

template <typename T>
FERRY_AVX2 void GemmAvx2(const float* x, int64_t xs, int64_t rows, int64_t k, const T* packed,
                         int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  int64_t m = 0;
  for (; m + 6 <= rows; m += 6)
    RowsAvx2<6, 1>(x + m * xs, xs, k, packed, p0, p1, n, out + m * os, os);
  switch (rows - m) {
    case 5:
      RowsAvx2<5, 1>(x + m * xs, xs, k, packed, p0, p1, n, out + m * os, os);
      break;
    case 4:
      RowsAvx2<4, 1>(x + m * xs, xs, k, packed, p0, p1, n, out + m * os, os);
      break;
    case 3:
      RowsAvx2<3, 2>(x + m * xs, xs, k, packed, p0, p1, n, out + m * os, os);
      break;
    case 2:
      RowsAvx2<2, 3>(x + m * xs, xs, k, packed, p0, p1, n, out + m * os, os);
      break;
    case 1:
      RowsAvx2<1, 4>(x + m * xs, xs, k, packed, p0, p1, n, out + m * os, os);
      break;
    default:
      break;
  }
}

// bf16 products: two FMAs per pair (odd element first) under FlushDenormals. Lanes are 32-bit
// (bf16 pairs); the even element is the low half.
FERRY_AVX2 inline __m256 EvenHalves(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
}
FERRY_AVX2 inline __m256 OddHalves(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(0xFFFF0000u)));
}

template <int MR, int NP>
FERRY_AVX2 inline void TileBf16Avx2(const uint16_t* xb, int64_t xs, int64_t k2,
                                    const uint16_t* panel0, int64_t panel_stride, int64_t first_col,
                                    int64_t n, float* out, int64_t os) {
  __m256 acc[MR][NP][2];
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
  }
  for (int64_t i = 0; i < k2 / 2; ++i) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const uint16_t* b = panel0 + p * panel_stride + i * 2 * kPanel;
      const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
      const __m256i b1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      const __m256 w0o = OddHalves(b0), w0e = EvenHalves(b0);
      const __m256 w1o = OddHalves(b1), w1e = EvenHalves(b1);
      FERRY_UNROLL
      for (int r = 0; r < MR; ++r) {
        uint32_t pair;
        std::memcpy(&pair, xb + r * xs + 2 * i, 4);
        const __m256i xp = _mm256_set1_epi32(static_cast<int>(pair));
        const __m256 xo = OddHalves(xp), xe = EvenHalves(xp);
        acc[r][p][0] = _mm256_fmadd_ps(xe, w0e, _mm256_fmadd_ps(xo, w0o, acc[r][p][0]));
        acc[r][p][1] = _mm256_fmadd_ps(xe, w1e, _mm256_fmadd_ps(xo, w1o, acc[r][p][1]));
      }
    }
  }
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      alignas(32) float tile[kPanel];
      _mm256_store_ps(tile, acc[r][p][0]);
      _mm256_store_ps(tile + 8, acc[r][p][1]);
      StoreColumns(tile, first_col + p * kPanel, n, out + r * os);
    }
  }
}

template <int MR, int NP>
FERRY_AVX2 void RowsBf16Avx2(const uint16_t* xb, int64_t xs, int64_t k2, const uint16_t* packed,
                             int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  const int64_t ps = kPanel * k2;
  ForPanelTiles<NP>(p0, p1, [&](auto np, int64_t p) {
    TileBf16Avx2<MR, decltype(np)::value>(xb, xs, k2, packed + p * ps, ps, p * kPanel, n, out, os);
  });
}

FERRY_AVX2 void GemmBf16Avx2(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                             const uint16_t* packed, int64_t p0, int64_t p1, int64_t n, float* out,
                             int64_t os) {
  FlushDenormals flush;
  int64_t m = 0;
  for (; m + 4 <= rows; m += 4) {
    RowsBf16Avx2<4, 1>(xb + m * xs, xs, k2, packed, p0, p1, n, out + m * os, os);
  }
  switch (rows - m) {
    case 3:
      RowsBf16Avx2<3, 1>(xb + m * xs, xs, k2, packed, p0, p1, n, out + m * os, os);
      break;
    case 2:
      RowsBf16Avx2<2, 2>(xb + m * xs, xs, k2, packed, p0, p1, n, out + m * os, os);
      break;
    case 1:
      RowsBf16Avx2<1, 3>(xb + m * xs, xs, k2, packed, p0, p1, n, out + m * os, os);
      break;
    default:
      break;
  }
}

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

template <typename T>
FERRY_AVX2 void DotColumnsAvx2(const float* q, int64_t qs, int64_t queries, const T* kt, int64_t ld,
                               int64_t dims, int64_t count, float* scores, int64_t ss) {
  ForTiles<6>(queries, [&](auto n, int64_t g) {
    DotColumnsTileAvx2<decltype(n)::value>(q + g * qs, qs, kt, ld, dims, count, scores + g * ss,
                                           ss);
  });
}

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

// FloatToBf16 on 8 lanes: (bits + 0x7fff + ((bits >> 16) & 1)) >> 16; NaN keeps its top half
// with the quiet bit set.
FERRY_AVX2 inline __m128i RoundBf16x8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan_r = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, nan_r, is_nan);
  // Pack the 8 low halves: within-lane pack then fix the lane order.
  const __m256i packed = _mm256_packus_epi32(r, r);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

FERRY_AVX2 void RoundBf16Avx2(const float* x, int64_t k, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), RoundBf16x8(_mm256_loadu_ps(x + i)));
  }
  RoundActivationsBf16Tail(x, i, k, out);
}

FERRY_AVX2 float SumSquaresAvx2(const float* x, int64_t n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const int64_t full = n - n % 16;
  for (int64_t i = 0; i < full; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    lo = _mm256_fmadd_ps(a, a, lo);
    hi = _mm256_fmadd_ps(b, b, hi);
  }
  alignas(32) float acc[16];
  _mm256_store_ps(acc, lo);
  _mm256_store_ps(acc + 8, hi);
  for (int64_t i = full; i < n; ++i) acc[i - full] = std::fma(x[i], x[i], acc[i - full]);
  return ReduceLanes(acc);
}

// Exp of float_math.h, 8 lanes, the same operations in the same order.
FERRY_AVX2 inline __m256 ExpAvx2(__m256 x) {
  using namespace float_math_internal;
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2E)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 neg_n = _mm256_xor_ps(n, _mm256_set1_ps(-0.0f));
  __m256 r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kC7);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC0));
  // Clamp n so the exponent arithmetic stays in range for lanes replaced below.
  const __m256i ni = _mm256_cvttps_epi32(
      _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-150.0f)), _mm256_set1_ps(128.0f)));
  // n1 = ni / 2 rounded toward zero, n2 = ni - n1.
  const __m256i n1 = _mm256_srai_epi32(_mm256_add_epi32(ni, _mm256_srli_epi32(ni, 31)), 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 result = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  result = _mm256_blendv_ps(result, _mm256_set1_ps(INFINITY),
                            _mm256_cmp_ps(x, _mm256_set1_ps(kExpMax), _CMP_GT_OQ));
  result = _mm256_blendv_ps(result, _mm256_setzero_ps(),
                            _mm256_cmp_ps(x, _mm256_set1_ps(kExpMin), _CMP_LT_OQ));
  return _mm256_blendv_ps(result, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

FERRY_AVX2 float ScaleMaxAvx2(float* x, int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
    _mm256_storeu_ps(x + i, v);
    m = _mm256_max_ps(v, m);  // v > m ? v : m, lane by lane
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = ScaleMaxScalar(x + i, n - i, scale);
  for (float l : lanes) r = l > r ? l : r;
  return r;
}

FERRY_AVX2 float ExpSumAvx2(float* x, int64_t n, float sub) {
  const __m256 s = _mm256_set1_ps(sub);
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const int64_t full = n - n % 16;
  for (int64_t i = 0; i < full; i += 16) {
    const __m256 a = ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
    const __m256 b = ExpAvx2(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8), s));
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    lo = _mm256_add_ps(lo, a);
    hi = _mm256_add_ps(hi, b);
  }
  alignas(32) float acc[16];
  _mm256_store_ps(acc, lo);
  _mm256_store_ps(acc + 8, hi);
  for (int64_t i = full; i < n; ++i) {
    x[i] = Exp(x[i] - sub);
    acc[i - full] += x[i];
  }
  return ReduceLanes(acc);
}

FERRY_AVX2 void SiluMulAvx2(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = ExpAvx2(_mm256_xor_ps(gv, _mm256_set1_ps(-0.0f)));
    _mm256_storeu_ps(
        out + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
  }
  SiluMulScalar(g + i, u + i, out + i, n - i);
}

const CpuKernels kAvx2Kernels = {GemmAvx2<float>,
                                 GemmBf16Avx2,
                                 DotColumnsAvx2<float>,
                                 DotColumnsAvx2<uint16_t>,
                                 WeightedRowsAvx2<float>,
                                 WeightedRowsAvx2<uint16_t>,
                                 ScaleMaxAvx2,
                                 ExpSumAvx2,
                                 RoundBf16Avx2,
                                 SumSquaresAvx2,
                                 SiluMulAvx2};

// ---- AVX-512: 16 lanes; a panel is one vector. ----

#define FERRY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

FERRY_AVX512 inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
FERRY_AVX512 inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

FERRY_AVX512 inline __m512 LoadMasked16(const float* p, __mmask16 mask) {
  return _mm512_maskz_loadu_ps(mask, p);
}
FERRY_AVX512 inline __m512 LoadMasked16(const uint16_t* p, __mmask16 mask) {
  const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int MR, int NP, typename T>
FERRY_AVX512 inline void TileAvx512(const float* x, int64_t xs, int64_t k, const T* panel0,
                                    int64_t panel_stride, int64_t first_col, int64_t n, float* out,
                                    int64_t os) {
  __m512 acc[MR][NP];
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const __m512 b = Load16(panel0 + p * panel_stride + kk * kPanel);
      FERRY_UNROLL
      for (int r = 0; r < MR; ++r) {
        acc[r][p] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * xs + kk]), b, acc[r][p]);
      }
    }
  }
  StoreTile512<MR, NP>(acc, first_col, n, out, os);
}

template <int MR, int NP, typename T>
FERRY_AVX512 void RowsAvx512(const float* x, int64_t xs, int64_t k, const T* packed, int64_t p0,
                             int64_t p1, int64_t n, float* out, int64_t os) {
  const int64_t ps = kPanel * k;
  ForPanelTiles<NP>(p0, p1, [&](auto np, int64_t p) {
    TileAvx512<MR, decltype(np)::value>(x, xs, k, packed + p * ps, ps, p * kPanel, n, out, os);
  });
}

template <typename T>
FERRY_AVX512 void GemmAvx512(const float* x, int64_t xs, int64_t rows, int64_t k, const T* packed,
                             int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  int64_t m = 0;
  for (; m + 8 <= rows; m += 8) {
    RowsAvx512<8, 3>(x + m * xs, xs, k, packed, p0, p1, n, out + m * os, os);
  }
  const float* xm = x + m * xs;
  float* om = out + m * os;
  switch (rows - m) {
    case 7:
      RowsAvx512<7, 3>(xm, xs, k, packed, p0, p1, n, om, os);
      break;
    case 6:
      RowsAvx512<6, 4>(xm, xs, k, packed, p0, p1, n, om, os);
      break;
    case 5:
      RowsAvx512<5, 4>(xm, xs, k, packed, p0, p1, n, om, os);
      break;
    case 4:
      RowsAvx512<4, 6>(xm, xs, k, packed, p0, p1, n, om, os);
      break;
    case 3:
      RowsAvx512<3, 8>(xm, xs, k, packed, p0, p1, n, om, os);
      break;
    case 2:
      RowsAvx512<2, 8>(xm, xs, k, packed, p0, p1, n, om, os);
      break;
    case 1:
      RowsAvx512<1, 8>(xm, xs, k, packed, p0, p1, n, om, os);
      break;
    default:
      break;
  }
}

FERRY_AVX512 inline __m512 EvenHalves512(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
}
FERRY_AVX512 inline __m512 OddHalves512(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(0xFFFF0000u)));
}

template <int MR, int NP>
FERRY_AVX512 inline void TileBf16Avx512(const uint16_t* xb, int64_t xs, int64_t k2,
                                        const uint16_t* panel0, int64_t panel_stride,
                                        int64_t first_col, int64_t n, float* out, int64_t os) {
  __m512 acc[MR][NP];
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < k2 / 2; ++i) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const __m512i b = _mm512_loadu_si512(panel0 + p * panel_stride + i * 2 * kPanel);
      const __m512 wo = OddHalves512(b), we = EvenHalves512(b);
      FERRY_UNROLL
      for (int r = 0; r < MR; ++r) {
        uint32_t pair;
        std::memcpy(&pair, xb + r * xs + 2 * i, 4);
        const __m512i xp = _mm512_set1_epi32(static_cast<int>(pair));
        acc[r][p] = _mm512_fmadd_ps(EvenHalves512(xp), we,
                                    _mm512_fmadd_ps(OddHalves512(xp), wo, acc[r][p]));
      }
    }
  }
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      alignas(64) float tile[kPanel];
      _mm512_store_ps(tile, acc[r][p]);
      StoreColumns(tile, first_col + p * kPanel, n, out + r * os);
    }
  }
}

template <int MR, int NP>
FERRY_AVX512 void RowsBf16Avx512(const uint16_t* xb, int64_t xs, int64_t k2, const uint16_t* packed,
                                 int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  const int64_t ps = kPanel * k2;
  ForPanelTiles<NP>(p0, p1, [&](auto np, int64_t p) {
    TileBf16Avx512<MR, decltype(np)::value>(xb, xs, k2, packed + p * ps, ps, p * kPanel, n, out,
                                            os);
  });
}

FERRY_AVX512 void GemmBf16Avx512(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                                 const uint16_t* packed, int64_t p0, int64_t p1, int64_t n,
                                 float* out, int64_t os) {
  FlushDenormals flush;
  int64_t m = 0;
  for (; m + 8 <= rows; m += 8) {
    RowsBf16Avx512<8, 2>(xb + m * xs, xs, k2, packed, p0, p1, n, out + m * os, os);
  }
  const uint16_t* xm = xb + m * xs;
  float* om = out + m * os;
  switch (rows - m) {
    case 7:
      RowsBf16Avx512<7, 2>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 6:
      RowsBf16Avx512<6, 2>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 5:
      RowsBf16Avx512<5, 3>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 4:
      RowsBf16Avx512<4, 4>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 3:
      RowsBf16Avx512<3, 4>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 2:
      RowsBf16Avx512<2, 6>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 1:
      RowsBf16Avx512<1, 8>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    default:
      break;
  }
}

// ---- AVX512-BF16: VDPBF16PS, 32 products per instruction. ----

#define FERRY_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

template <int MR, int NP>
FERRY_AVX512BF16 inline void TileDpbf16(const uint16_t* xb, int64_t xs, int64_t k2,
                                        const uint16_t* panel0, int64_t panel_stride,
                                        int64_t first_col, int64_t n, float* out, int64_t os) {
  __m512 acc[MR][NP];
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < k2 / 2; ++i) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const __m512bh b = reinterpret_cast<__m512bh>(
          _mm512_loadu_si512(panel0 + p * panel_stride + i * 2 * kPanel));
      FERRY_UNROLL
      for (int r = 0; r < MR; ++r) {
        uint32_t pair;
        std::memcpy(&pair, xb + r * xs + 2 * i, 4);
        const __m512bh xp = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
        acc[r][p] = _mm512_dpbf16_ps(acc[r][p], xp, b);
      }
    }
  }
  StoreTile512<MR, NP>(acc, first_col, n, out, os);
}

template <int MR, int NP>
FERRY_AVX512BF16 void RowsDpbf16(const uint16_t* xb, int64_t xs, int64_t k2, const uint16_t* packed,
                                 int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  const int64_t ps = kPanel * k2;
  ForPanelTiles<NP>(p0, p1, [&](auto np, int64_t p) {
    TileDpbf16<MR, decltype(np)::value>(xb, xs, k2, packed + p * ps, ps, p * kPanel, n, out, os);
  });
}

FERRY_AVX512BF16 void GemmBf16Dpbf16(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                                     const uint16_t* packed, int64_t p0, int64_t p1, int64_t n,
                                     float* out, int64_t os) {
  int64_t m = 0;
  for (; m + 8 <= rows; m += 8) {
    RowsDpbf16<8, 3>(xb + m * xs, xs, k2, packed, p0, p1, n, out + m * os, os);
  }
  const uint16_t* xm = xb + m * xs;
  float* om = out + m * os;
  switch (rows - m) {
    case 7:
      RowsDpbf16<7, 3>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 6:
      RowsDpbf16<6, 4>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 5:
      RowsDpbf16<5, 4>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 4:
      RowsDpbf16<4, 6>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 3:
      RowsDpbf16<3, 8>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 2:
      RowsDpbf16<2, 8>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    case 1:
      RowsDpbf16<1, 8>(xm, xs, k2, packed, p0, p1, n, om, os);
      break;
    default:
      break;
  }
}

inline __mmask16 LaneMask(int64_t valid) {
  return valid >= 16 ? 0xFFFF : valid <= 0 ? 0 : static_cast<__mmask16>((1u << valid) - 1);
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

template <typename T>
FERRY_AVX512 void DotColumnsAvx512(const float* q, int64_t qs, int64_t queries, const T* kt,
                                   int64_t ld, int64_t dims, int64_t count, float* scores,
                                   int64_t ss) {
  ForTiles<8>(queries, [&](auto n, int64_t g) {
    DotColumnsTileAvx512<decltype(n)::value>(q + g * qs, qs, kt, ld, dims, count, scores + g * ss,
                                             ss);
  });
}

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

FERRY_AVX512 float ScaleMaxAvx512(float* x, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = LaneMask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, x + i), s);
    _mm512_mask_storeu_ps(x + i, mask, v);
    m = _mm512_mask_max_ps(m, mask, v, m);  // v > m ? v : m in the valid lanes
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, m);
  float r = -std::numeric_limits<float>::infinity();
  for (float l : lanes) r = l > r ? l : r;
  return r;
}

FERRY_AVX512 float SumSquaresAvx512(const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  const int64_t full = n - n % 16;
  for (int64_t i = 0; i < full; i += 16) {
    const __m512 a = _mm512_loadu_ps(x + i);
    acc = _mm512_fmadd_ps(a, a, acc);
  }
  alignas(64) float a[16];
  _mm512_store_ps(a, acc);
  for (int64_t i = full; i < n; ++i) a[i - full] = std::fma(x[i], x[i], a[i - full]);
  return ReduceLanes(a);
}

const CpuKernels kAvx512Kernels = {GemmAvx512<float>,
                                   GemmBf16Avx512,
                                   DotColumnsAvx512<float>,
                                   DotColumnsAvx512<uint16_t>,
                                   WeightedRowsAvx512<float>,
                                   WeightedRowsAvx512<uint16_t>,
                                   ScaleMaxAvx512,
                                   ExpSumAvx2,
                                   RoundBf16Avx2,
                                   SumSquaresAvx512,
                                   SiluMulAvx2};

const CpuKernels kAvx512Bf16Kernels = {GemmAvx512<float>,
                                       GemmBf16Dpbf16,
                                       DotColumnsAvx512<float>,
                                       DotColumnsAvx512<uint16_t>,
                                       WeightedRowsAvx512<float>,
                                       WeightedRowsAvx512<uint16_t>,
                                       ScaleMaxAvx512,
                                       ExpSumAvx2,
                                       RoundBf16Avx2,
                                       SumSquaresAvx512,
                                       SiluMulAvx2};

#endif  // FERRY_HAVE_X86

constexpr CpuIsa kAllIsas[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512,
                               CpuIsa::kAvx512Bf16};

#ifdef FERRY_HAVE_X86
bool HasAvx512Bf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1;  // CPUID.(EAX=7,ECX=1):EAX[5] AVX512_BF16
}
#endif

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "?";
}

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
#ifdef FERRY_HAVE_X86
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && CpuSupports(CpuIsa::kAvx2);
    case CpuIsa::kAvx512Bf16:
      return CpuSupports(CpuIsa::kAvx512) && HasAvx512Bf16();
#endif
    default:
      return false;
  }
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : kAllIsas) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

absl::StatusOr<CpuIsa> SelectCpuIsa() {
  const char* forced = std::getenv("FERRY_CPU_ISA");
  if (forced == nullptr || *forced == '\0') return SupportedCpuIsas().back();
  for (CpuIsa isa : kAllIsas) {
    if (std::strcmp(forced, CpuIsaName(isa)) != 0) continue;
    if (!CpuSupports(isa)) {
      return absl::FailedPreconditionError(
          absl::StrCat("FERRY_CPU_ISA=", forced, ": this CPU does not support it"));
    }
    return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("FERRY_CPU_ISA=", forced, ": unknown (scalar, avx2, avx512, avx512bf16)"));
}

const CpuKernels& CpuKernelsFor(CpuIsa isa) {
#ifdef FERRY_HAVE_X86
  if (isa == CpuIsa::kAvx2) return kAvx2Kernels;
  if (isa == CpuIsa::kAvx512) return kAvx512Kernels;
  if (isa == CpuIsa::kAvx512Bf16) return kAvx512Bf16Kernels;
#endif
  return kScalarKernels;
}

}  // namespace ferry
