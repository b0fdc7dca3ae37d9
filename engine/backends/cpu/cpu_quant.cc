#include "engine/backends/cpu/cpu_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "engine/backends/cpu/cpu_tiles.h"
#include "engine/common/float_math.h"
#include "engine/common/log.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define FERRY_HAVE_X86 1
// GCC 12 warns about the deliberately undefined source register inside _mm512_cvtph_ps and
// _mm512_cvtepi32_ps (`__m512 __Y = __Y;`), a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace ferry {

using cpu_internal::ForPanelTiles;
using cpu_internal::StoreColumns;
#ifdef FERRY_HAVE_X86
using cpu_internal::StoreTile512;
#endif
namespace {

uint16_t Load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// What distinguishes the formats, at compile time.
template <WeightQuant Q>
struct Format {
  static constexpr bool kMin = Q == WeightQuant::kQ4_1 || Q == WeightQuant::kQ5_1;
  static constexpr bool kHigh = Q == WeightQuant::kQ5_0 || Q == WeightQuant::kQ5_1;
  static constexpr bool kByte = Q == WeightQuant::kQ8_0;
  // z of the header: values are dw * (u - z).
  static constexpr int kZero = Q == WeightQuant::kQ4_0 ? 8 : Q == WeightQuant::kQ5_0 ? 16 : 0;
  static constexpr int64_t kMinOffset = 32;
  static constexpr int64_t kHighOffset = kMin ? 64 : 32;
  static constexpr int64_t kQuantOffset = kHighOffset + (kHigh ? 64 : 0);
  static constexpr int64_t kBytes = kQuantOffset + (kByte ? 512 : 256);
  static constexpr int64_t kGgmlBytes = kByte ? 34 : 2 + (kMin ? 2 : 0) + (kHigh ? 4 : 0) + 16;
};

// Calls f(Format<Q>{}) with the Q of `quant`.
template <typename F>
auto Dispatch(WeightQuant quant, F&& f) {
  switch (quant) {
    case WeightQuant::kQ8_0:
      return f(std::integral_constant<WeightQuant, WeightQuant::kQ8_0>{});
    case WeightQuant::kQ4_0:
      return f(std::integral_constant<WeightQuant, WeightQuant::kQ4_0>{});
    case WeightQuant::kQ4_1:
      return f(std::integral_constant<WeightQuant, WeightQuant::kQ4_1>{});
    case WeightQuant::kQ5_0:
      return f(std::integral_constant<WeightQuant, WeightQuant::kQ5_0>{});
    case WeightQuant::kQ5_1:
      break;
    case WeightQuant::kNone:
      LOG(FATAL) << "not a block format";
  }
  return f(std::integral_constant<WeightQuant, WeightQuant::kQ5_1>{});
}

// The 32 integers u of one GGML block (Q8_0 as signed values, the others unsigned).
template <WeightQuant Q>
void UnpackGgmlBlock(const uint8_t* block, int32_t* u, uint16_t* d, uint16_t* m) {
  using F = Format<Q>;
  *d = Load16(block);
  *m = F::kMin ? Load16(block + 2) : 0;
  if constexpr (F::kByte) {
    for (int i = 0; i < 32; ++i) u[i] = static_cast<int8_t>(block[2 + i]);
    return;
  }
  const uint8_t* qs = block + 2 + (F::kMin ? 2 : 0) + (F::kHigh ? 4 : 0);
  const uint32_t qh = F::kHigh ? Load32(block + 2 + (F::kMin ? 2 : 0)) : 0;
  for (int j = 0; j < 16; ++j) {
    u[j] = (qs[j] & 0x0f) | static_cast<int32_t>((qh >> j) & 1) << 4;
    u[j + 16] = (qs[j] >> 4) | static_cast<int32_t>((qh >> (j + 16)) & 1) << 4;
  }
}

template <WeightQuant Q>
void PackPanel(const uint8_t* rows, int64_t count, int64_t k, uint8_t* panel) {
  using F = Format<Q>;
  const int64_t blocks = k / kQuantBlock;
  std::memset(panel, 0, blocks * F::kBytes);
  for (int64_t c = 0; c < count; ++c) {
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t u[32];
      uint16_t d, m;
      UnpackGgmlBlock<Q>(rows + (c * blocks + b) * F::kGgmlBytes, u, &d, &m);
      uint8_t* out = panel + b * F::kBytes;
      std::memcpy(out + 2 * c, &d, 2);
      if (F::kMin) std::memcpy(out + F::kMinOffset + 2 * c, &m, 2);
      uint8_t* quants = out + F::kQuantOffset;
      for (int kk = 0; kk < 32; ++kk) {
        const int j = kk % 4;
        if constexpr (F::kByte) {
          quants[(kk / 4) * 64 + c * 4 + j] = static_cast<uint8_t>(u[kk]);
        } else {
          const int g = (kk % 16) / 4;
          const bool hi = kk >= 16;
          quants[g * 64 + c * 4 + j] |= static_cast<uint8_t>((u[kk] & 15) << (hi ? 4 : 0));
          if (F::kHigh) {
            out[F::kHighOffset + c * 4 + j] |=
                static_cast<uint8_t>(((u[kk] >> 4) & 1) << (hi ? 4 + g : g));
          }
        }
      }
    }
  }
}

// u[c][kk] - z of one packed block.
template <WeightQuant Q>
inline int32_t PackedValue(const uint8_t* block, int64_t c, int kk) {
  using F = Format<Q>;
  const uint8_t* quants = block + F::kQuantOffset;
  const int j = kk % 4;
  if constexpr (F::kByte) {
    return static_cast<int8_t>(quants[(kk / 4) * 64 + c * 4 + j]);
  } else {
    const int g = (kk % 16) / 4;
    const bool hi = kk >= 16;
    int32_t u = (quants[g * 64 + c * 4 + j] >> (hi ? 4 : 0)) & 15;
    if (F::kHigh) u |= ((block[F::kHighOffset + c * 4 + j] >> (hi ? 4 + g : g)) & 1) << 4;
    return u - F::kZero;
  }
}

template <WeightQuant Q>
void DequantizeRow(const uint8_t* packed, int64_t row, int64_t k, float* out) {
  using F = Format<Q>;
  const int64_t blocks = k / kQuantBlock, c = row % kPanel;
  const uint8_t* panel = packed + row / kPanel * blocks * F::kBytes;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = panel + b * F::kBytes;
    const float d = HalfToFloat(Load16(block + 2 * c));
    const float m = F::kMin ? HalfToFloat(Load16(block + F::kMinOffset + 2 * c)) : 0.0f;
    for (int kk = 0; kk < 32; ++kk) {
      const float v = d * static_cast<float>(PackedValue<Q>(block, c, kk));
      out[b * 32 + kk] = F::kMin ? v + m : v;
    }
  }
}

// ---- Scalar: the definition. ----

template <WeightQuant Q>
void GemmScalarQ(const QuantizedRows& x, int64_t rows, const uint8_t* packed, int64_t p0,
                 int64_t p1, int64_t n, float* out, int64_t os) {
  using F = Format<Q>;
  const int64_t blocks = x.k / kQuantBlock;
  for (int64_t m = 0; m < rows; ++m) {
    const int8_t* q = x.q + m * x.k;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* panel = packed + p * blocks * F::kBytes;
      float tile[kPanel];
      for (int64_t c = 0; c < kPanel; ++c) {
        float acc = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* block = panel + b * F::kBytes;
          int32_t isum = 0;
          for (int kk = 0; kk < 32; ++kk) isum += q[b * 32 + kk] * PackedValue<Q>(block, c, kk);
          const float dw = HalfToFloat(Load16(block + 2 * c));
          acc = std::fma(dw * x.d[m * blocks + b], static_cast<float>(isum), acc);
          if (F::kMin) {
            acc = std::fma(HalfToFloat(Load16(block + F::kMinOffset + 2 * c)), x.s[m * blocks + b],
                           acc);
          }
        }
        tile[c] = acc;
      }
      StoreColumns(tile, p * kPanel, n, out + m * os);
    }
  }
}

void GemmScalar(WeightQuant quant, const QuantizedRows& x, int64_t rows, const uint8_t* packed,
                int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  Dispatch(quant,
           [&](auto q) { GemmScalarQ<decltype(q)::value>(x, rows, packed, p0, p1, n, out, os); });
}

#ifdef FERRY_HAVE_X86

// ---- AVX2 + F16C: a panel is two halves of 8 rows; VPMADDUBSW pairs, VPMADDWD quads. ----

#define FERRY_QAVX2 __attribute__((target("avx2,fma,f16c")))

// Block b's 8 groups of a half panel (rows 8h..8h+7) as unsigned bytes (Q8_0: |u|, with the
// signs in `sign`).
template <WeightQuant Q>
FERRY_QAVX2 inline void UnpackAvx2(const uint8_t* block, int h, __m256i* w, __m256i* sign) {
  using F = Format<Q>;
  const uint8_t* quants = block + F::kQuantOffset + 32 * h;
  if constexpr (F::kByte) {
    FERRY_UNROLL
    for (int g = 0; g < 8; ++g) {
      sign[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * g));
      w[g] = _mm256_abs_epi8(sign[g]);
    }
  } else {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i qh = _mm256_setzero_si256();
    if (F::kHigh) {
      qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + F::kHighOffset + 32 * h));
    }
    FERRY_UNROLL
    for (int g = 0; g < 4; ++g) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * g));
      w[g] = _mm256_and_si256(raw, low);
      w[g + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      if (F::kHigh) {
        const __m256i one = _mm256_set1_epi8(1);
        w[g] = _mm256_or_si256(
            w[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, g), one), 4));
        w[g + 4] = _mm256_or_si256(
            w[g + 4], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, g + 4), one), 4));
      }
    }
  }
}

template <WeightQuant Q, int MR, int NP>
FERRY_QAVX2 inline void TileAvx2(const QuantizedRows& x, const uint8_t* panel0,
                                 int64_t panel_stride, int64_t first_col, int64_t n, float* out,
                                 int64_t os) {
  using F = Format<Q>;
  const int64_t blocks = x.k / kQuantBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[MR][NP][2];
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) acc[r][p][0] = acc[r][p][1] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const uint8_t* block = panel0 + p * panel_stride + b * F::kBytes;
      FERRY_UNROLL
      for (int h = 0; h < 2; ++h) {
        __m256i w[8], sign[8];
        UnpackAvx2<Q>(block, h, w, sign);
        const __m256 dw =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16 * h)));
        __m256 mw = _mm256_setzero_ps();
        if (F::kMin) {
          mw = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + F::kMinOffset + 16 * h)));
        }
        FERRY_UNROLL
        for (int r = 0; r < MR; ++r) {
          const int8_t* q = x.q + r * x.k + b * 32;
          __m256i s = _mm256_setzero_si256();
          FERRY_UNROLL
          for (int g = 0; g < 8; ++g) {
            int32_t quad;
            std::memcpy(&quad, q + 4 * g, 4);
            __m256i a = _mm256_set1_epi32(quad);
            if (F::kByte) a = _mm256_sign_epi8(a, sign[g]);
            s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], a), ones));
          }
          if (F::kZero != 0) {
            s = _mm256_sub_epi32(s, _mm256_set1_epi32(F::kZero * x.sum[r * blocks + b]));
          }
          const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(x.d[r * blocks + b]));
          acc[r][p][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), acc[r][p][h]);
          if (F::kMin) {
            acc[r][p][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x.s[r * blocks + b]), acc[r][p][h]);
          }
        }
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

template <WeightQuant Q, int MR, int NP>
FERRY_QAVX2 void RowsAvx2(const QuantizedRows& x, const uint8_t* packed, int64_t p0, int64_t p1,
                          int64_t n, float* out, int64_t os) {
  const int64_t ps = x.k / kQuantBlock * Format<Q>::kBytes;
  ForPanelTiles<NP>(p0, p1, [&](auto np, int64_t p) {
    TileAvx2<Q, MR, decltype(np)::value>(x, packed + p * ps, ps, p * kPanel, n, out, os);
  });
}

template <WeightQuant Q>
FERRY_QAVX2 void GemmAvx2Q(const QuantizedRows& x, int64_t rows, const uint8_t* packed, int64_t p0,
                           int64_t p1, int64_t n, float* out, int64_t os) {
  int64_t m = 0;
  for (; m + 4 <= rows; m += 4) RowsAvx2<Q, 4, 1>(x.From(m), packed, p0, p1, n, out + m * os, os);
  switch (rows - m) {
    case 3:
      RowsAvx2<Q, 3, 1>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    case 2:
      RowsAvx2<Q, 2, 1>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    case 1:
      RowsAvx2<Q, 1, 1>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    default:
      break;
  }
}

void GemmAvx2(WeightQuant quant, const QuantizedRows& x, int64_t rows, const uint8_t* packed,
              int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  Dispatch(quant,
           [&](auto q) { GemmAvx2Q<decltype(q)::value>(x, rows, packed, p0, p1, n, out, os); });
}

// ---- AVX512-VNNI: a panel is one vector; VPDPBUSD sums quads straight into 32-bit lanes. ----

#define FERRY_QVNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

// Block b's 8 groups as unsigned bytes: Q8_0 as u + 128 (so z becomes 128).
template <WeightQuant Q>
FERRY_QVNNI inline void UnpackVnni(const uint8_t* block, __m512i* w) {
  using F = Format<Q>;
  const uint8_t* quants = block + F::kQuantOffset;
  if constexpr (F::kByte) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    FERRY_UNROLL
    for (int g = 0; g < 8; ++g) w[g] = _mm512_xor_si512(_mm512_loadu_si512(quants + 64 * g), flip);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512i qh = _mm512_setzero_si512();
    if (F::kHigh) qh = _mm512_loadu_si512(block + F::kHighOffset);
    FERRY_UNROLL
    for (int g = 0; g < 4; ++g) {
      const __m512i raw = _mm512_loadu_si512(quants + 64 * g);
      w[g] = _mm512_and_si512(raw, low);
      w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
      if (F::kHigh) {
        const __m512i one = _mm512_set1_epi8(1);
        w[g] = _mm512_or_si512(
            w[g], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, g), one), 4));
        w[g + 4] = _mm512_or_si512(
            w[g + 4], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, g + 4), one), 4));
      }
    }
  }
}

// How far ahead of the block being computed a one-row product prefetches (bytes).
constexpr int64_t kPrefetchAhead = 4096;

template <WeightQuant Q, int MR, int NP>
FERRY_QVNNI inline void TileVnni(const QuantizedRows& x, const uint8_t* panel0,
                                 int64_t panel_stride, int64_t first_col, int64_t n, float* out,
                                 int64_t os) {
  using F = Format<Q>;
  constexpr int kZero = F::kByte ? 128 : F::kZero;
  const int64_t blocks = x.k / kQuantBlock;
  __m512 acc[MR][NP];
  FERRY_UNROLL
  for (int r = 0; r < MR; ++r) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    FERRY_UNROLL
    for (int p = 0; p < NP; ++p) {
      const uint8_t* block = panel0 + p * panel_stride + b * F::kBytes;
      if (MR == 1) {
        // One row (decode) streams the panels once: fetch ahead of the hardware prefetcher.
        FERRY_UNROLL
        for (int64_t l = 0; l < F::kBytes; l += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchAhead + l, _MM_HINT_T0);
        }
      }
      __m512i w[8];
      UnpackVnni<Q>(block, w);
      const __m512 dw =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
      __m512 mw = _mm512_setzero_ps();
      if (F::kMin) {
        mw = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + F::kMinOffset)));
      }
      FERRY_UNROLL
      for (int r = 0; r < MR; ++r) {
        const int8_t* q = x.q + r * x.k + b * 32;
        // Two chains of four: each VPDPBUSD waits on the one before it in its chain.
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        FERRY_UNROLL
        for (int g = 0; g < 8; g += 2) {
          int32_t a0, a1;
          std::memcpy(&a0, q + 4 * g, 4);
          std::memcpy(&a1, q + 4 * g + 4, 4);
          s0 = _mm512_dpbusd_epi32(s0, w[g], _mm512_set1_epi32(a0));
          s1 = _mm512_dpbusd_epi32(s1, w[g + 1], _mm512_set1_epi32(a1));
        }
        __m512i s = _mm512_add_epi32(s0, s1);
        if (kZero != 0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(kZero * x.sum[r * blocks + b]));
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(x.d[r * blocks + b]));
        acc[r][p] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[r][p]);
        if (F::kMin)
          acc[r][p] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x.s[r * blocks + b]), acc[r][p]);
      }
    }
  }
  StoreTile512<MR, NP>(acc, first_col, n, out, os);
}

template <WeightQuant Q, int MR, int NP>
FERRY_QVNNI void RowsVnni(const QuantizedRows& x, const uint8_t* packed, int64_t p0, int64_t p1,
                          int64_t n, float* out, int64_t os) {
  const int64_t ps = x.k / kQuantBlock * Format<Q>::kBytes;
  ForPanelTiles<NP>(p0, p1, [&](auto np, int64_t p) {
    TileVnni<Q, MR, decltype(np)::value>(x, packed + p * ps, ps, p * kPanel, n, out, os);
  });
}

template <WeightQuant Q>
FERRY_QVNNI void GemmVnniQ(const QuantizedRows& x, int64_t rows, const uint8_t* packed, int64_t p0,
                           int64_t p1, int64_t n, float* out, int64_t os) {
  int64_t m = 0;
  for (; m + 6 <= rows; m += 6) RowsVnni<Q, 6, 2>(x.From(m), packed, p0, p1, n, out + m * os, os);
  switch (rows - m) {
    case 5:
      RowsVnni<Q, 5, 2>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    case 4:
      RowsVnni<Q, 4, 2>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    case 3:
      RowsVnni<Q, 3, 2>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    case 2:
      RowsVnni<Q, 2, 4>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    case 1:
      // One panel at a time: the panels of a range lie one after the other, so one row reads
      // a single sequential stream (measured: 1.5x the rate of four panels at a time).
      RowsVnni<Q, 1, 1>(x.From(m), packed, p0, p1, n, out + m * os, os);
      break;
    default:
      break;
  }
}

void GemmVnni(WeightQuant quant, const QuantizedRows& x, int64_t rows, const uint8_t* packed,
              int64_t p0, int64_t p1, int64_t n, float* out, int64_t os) {
  Dispatch(quant,
           [&](auto q) { GemmVnniQ<decltype(q)::value>(x, rows, packed, p0, p1, n, out, os); });
}

#endif  // FERRY_HAVE_X86

}  // namespace

int64_t GgmlQuantBlockBytes(WeightQuant quant) {
  return Dispatch(quant, [](auto q) { return Format<decltype(q)::value>::kGgmlBytes; });
}

int64_t QuantPanelBlockBytes(WeightQuant quant) {
  return Dispatch(quant, [](auto q) { return Format<decltype(q)::value>::kBytes; });
}

int64_t PackedQuantBytes(WeightQuant quant, int64_t n, int64_t k) {
  return (n + kPanel - 1) / kPanel * (k / kQuantBlock) * QuantPanelBlockBytes(quant);
}

void PackQuantPanel(WeightQuant quant, const uint8_t* rows, int64_t count, int64_t k,
                    uint8_t* panel) {
  CHECK(count >= 0 && count <= kPanel && k % kQuantBlock == 0);
  Dispatch(quant, [&](auto q) { PackPanel<decltype(q)::value>(rows, count, k, panel); });
}

void DequantizePackedRow(WeightQuant quant, const uint8_t* packed, int64_t row, int64_t k,
                         float* out) {
  Dispatch(quant, [&](auto q) { DequantizeRow<decltype(q)::value>(packed, row, k, out); });
}

void QuantizeActivationRow(const float* x, int64_t k, int8_t* q, float* d, float* s, int32_t* sum) {
  for (int64_t b = 0; b < k / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) {
      const float a = std::fabs(xb[i]);
      amax = a > amax ? a : amax;
    }
    const float db = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t total = 0;
    for (int i = 0; i < kQuantBlock; ++i) {
      float r = std::nearbyint(xb[i] * id);  // the current rounding mode: nearest, ties to even
      r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
      const int32_t v = r == r ? static_cast<int32_t>(r) : 0;  // NaN (a NaN activation): 0
      q[b * kQuantBlock + i] = static_cast<int8_t>(v);
      total += v;
    }
    d[b] = HalfToFloat(FloatToHalf(db));
    sum[b] = total;
    s[b] = HalfToFloat(FloatToHalf(db * static_cast<float>(total)));
  }
}

const char* QuantIsaName(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar:
      return "scalar";
    case QuantIsa::kAvx2:
      return "avx2";
    case QuantIsa::kAvx512Vnni:
      return "avx512vnni";
  }
  return "?";
}

bool QuantIsaSupported(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar:
      return true;
#ifdef FERRY_HAVE_X86
    case QuantIsa::kAvx2:
      return CpuSupports(CpuIsa::kAvx2) && __builtin_cpu_supports("f16c");
    case QuantIsa::kAvx512Vnni:
      return CpuSupports(CpuIsa::kAvx512) && QuantIsaSupported(QuantIsa::kAvx2) &&
             __builtin_cpu_supports("avx512vnni");
#endif
    default:
      return false;
  }
}

QuantIsa QuantIsaFor(CpuIsa isa) {
  if ((isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16) &&
      QuantIsaSupported(QuantIsa::kAvx512Vnni)) {
    return QuantIsa::kAvx512Vnni;
  }
  if (isa != CpuIsa::kScalar && QuantIsaSupported(QuantIsa::kAvx2)) return QuantIsa::kAvx2;
  return QuantIsa::kScalar;
}

QuantGemmFn QuantGemmFor(QuantIsa isa) {
#ifdef FERRY_HAVE_X86
  if (isa == QuantIsa::kAvx2) return GemmAvx2;
  if (isa == QuantIsa::kAvx512Vnni) return GemmVnni;
#endif
  return GemmScalar;
}

}  // namespace ferry
