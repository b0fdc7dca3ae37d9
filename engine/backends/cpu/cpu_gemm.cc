// The CPU backend's matrix products (cpu_kernels.h): the packing of fp32 and bf16 weights into
// panels, the rounding of activations to bf16, and the fp32- and bf16-weight products in each
// instruction-set variant (cpu_kernels_internal.h), all in cpu_kernels.h's canonical order.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/backends/cpu/cpu_kernels.h"
#include "engine/backends/cpu/cpu_kernels_internal.h"
#include "engine/backends/cpu/cpu_tiles.h"
#include "engine/common/float_math.h"

namespace ferry {

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

namespace cpu_internal {
namespace {

// Elements [from, k) of RoundActivationsBf16, and its padding.
void RoundActivationsBf16Tail(const float* x, int64_t from, int64_t k, uint16_t* out) {
  for (int64_t i = from; i < k; ++i) out[i] = FloatToBf16(x[i]);
  if (k % 2 != 0) out[k] = 0;
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

}  // namespace

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

#ifdef FERRY_HAVE_X86

// ---- AVX2 + FMA: 8 lanes; a panel is two vectors. ----

namespace {

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

}  // namespace

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

// The instantiation the dispatch tables take.
template void GemmAvx2<float>(const float*, int64_t, int64_t, int64_t, const float*, int64_t,
                              int64_t, int64_t, float*, int64_t);

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

FERRY_AVX2 void RoundBf16Avx2(const float* x, int64_t k, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), RoundBf16x8(_mm256_loadu_ps(x + i)));
  }
  RoundActivationsBf16Tail(x, i, k, out);
}

// ---- AVX-512: 16 lanes; a panel is one vector. ----

namespace {

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

}  // namespace

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

// The instantiation the dispatch tables take.
template void GemmAvx512<float>(const float*, int64_t, int64_t, int64_t, const float*, int64_t,
                                int64_t, int64_t, float*, int64_t);

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

#endif  // FERRY_HAVE_X86

}  // namespace cpu_internal
}  // namespace ferry
