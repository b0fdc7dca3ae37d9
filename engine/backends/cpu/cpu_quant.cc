#include "engine/backends/cpu/cpu_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "engine/backends/cpu/cpu_tiles.h"
#include "engine/common/float_math.h"
#include "engine/common/log.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define FERRY_HAVE_X86 1
// GCC 12 warns about the deliberately undefined source register inside _mm512_cvtph_ps and
// _mm512_cvtepi32_ps (`__m512 __Y = __Y;`), a false positive.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
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
  static constexpr bool kSuper =
      Q == WeightQuant::kQ4_K || Q == WeightQuant::kQ5_K || Q == WeightQuant::kQ6_K;
  // Q4_K, Q5_K: 6-bit scales and minimums per sub-block; Q6_K: int8 scales per 16 values.
  static constexpr bool kSubScales = kSuper && Q != WeightQuant::kQ6_K;
  static constexpr bool kHalfScales = Q == WeightQuant::kQ6_K;
  // A minimum term: + mw * sx (Q4_1, Q5_1) or - (dmin * m_j) * sx (Q4_K, Q5_K).
  static constexpr bool kMin = Q == WeightQuant::kQ4_1 || Q == WeightQuant::kQ5_1 || kSubScales;
  static constexpr int kBits =
      Q == WeightQuant::kQ8_0                                                         ? 8
      : Q == WeightQuant::kQ6_K                                                       ? 6
      : Q == WeightQuant::kQ5_0 || Q == WeightQuant::kQ5_1 || Q == WeightQuant::kQ5_K ? 5
                                                                                      : 4;
  static constexpr bool kByte = kBits == 8;
  // z: values are dw * (u - z) (Q6_K: (dw * sc) * (u - z)).
  static constexpr int kZero = Q == WeightQuant::kQ4_0   ? 8
                               : Q == WeightQuant::kQ5_0 ? 16
                               : Q == WeightQuant::kQ6_K ? 32
                                                         : 0;
  static constexpr int64_t kSubBlocks = kSuper ? 8 : 1;
  static constexpr int64_t kHeadBytes = kMin ? 64 : 32;
  static constexpr int64_t kMinOffset = 32;  // in the header
  static constexpr int64_t kScaleBytes = kSuper ? 32 : 0;
  static constexpr int64_t kHighOffset = kScaleBytes;  // in a sub-block
  static constexpr int64_t kHighBytes = kBits == 5 ? 64 : kBits == 6 ? 128 : 0;
  static constexpr int64_t kQuantOffset = kHighOffset + kHighBytes;
  static constexpr int64_t kSubBytes = kQuantOffset + (kByte ? 512 : 256);
  static constexpr int64_t kSuperBytes = kHeadBytes + kSubBlocks * kSubBytes;
  static constexpr int64_t kGgmlElements = kSuper ? 256 : 32;
  static constexpr int64_t kGgmlBytes = Q == WeightQuant::kQ4_K   ? 144
                                        : Q == WeightQuant::kQ5_K ? 176
                                        : Q == WeightQuant::kQ6_K ? 210
                                        : kByte                   ? 34
                                                : 2 + (kMin ? 2 : 0) + (kBits == 5 ? 4 : 0) + 16;

  static int64_t PanelBytes(int64_t k) { return k / (kQuantBlock * kSubBlocks) * kSuperBytes; }
  // The header and the sub-block of 32-value block b of a panel.
  template <typename Byte>  // uint8_t or const uint8_t
  static Byte* Head(Byte* panel, int64_t b) {
    return panel + b / kSubBlocks * kSuperBytes;
  }
  template <typename Byte>
  static Byte* Sub(Byte* panel, int64_t b) {
    return Head(panel, b) + kHeadBytes + b % kSubBlocks * kSubBytes;
  }
};

// Calls f(std::integral_constant<WeightQuant, Q>) with the Q of `quant`.
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
      return f(std::integral_constant<WeightQuant, WeightQuant::kQ5_1>{});
    case WeightQuant::kQ4_K:
      return f(std::integral_constant<WeightQuant, WeightQuant::kQ4_K>{});
    case WeightQuant::kQ5_K:
      return f(std::integral_constant<WeightQuant, WeightQuant::kQ5_K>{});
    case WeightQuant::kQ6_K:
      break;
    case WeightQuant::kNone:
      LOG(FATAL) << "not a block format";
  }
  return f(std::integral_constant<WeightQuant, WeightQuant::kQ6_K>{});
}

// One GGML block unpacked: its integers u (Q8_0 signed, the others unsigned), scales and, per
// 32 values (sub-block j), the K-quants' integer scales and minimums (Q6_K: sc[2j], sc[2j + 1]
// are the two 16-value scales).
struct GgmlBlock {
  int32_t u[256];
  uint16_t d = 0, m = 0;
  int32_t sc[16] = {}, mn[8] = {};
};

// Sub-block j's (j < 8) 6-bit scale and minimum from a K-quant's 12 bytes of scales.
void ScaleMinK4(const uint8_t* q, int j, int32_t* scale, int32_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <WeightQuant Q>
void UnpackGgmlBlock(const uint8_t* block, GgmlBlock* out) {
  using F = Format<Q>;
  int32_t* u = out->u;
  if constexpr (F::kHalfScales) {  // Q6_K: ql[128] qh[64] scales[16] d
    const uint8_t* ql = block;
    const uint8_t* qh = block + 128;
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, s = e % 128 / 32, l = e % 32;
      const int lo = (ql[64 * h + 32 * (s % 2) + l] >> (s >= 2 ? 4 : 0)) & 0x0f;
      u[e] = lo | ((qh[32 * h + l] >> (2 * s)) & 3) << 4;
    }
    for (int g = 0; g < 16; ++g) out->sc[g] = static_cast<int8_t>(block[192 + g]);
    out->d = Load16(block + 208);
  } else if constexpr (F::kSuper) {  // Q4_K, Q5_K: d dmin scales[12] (qh[32]) qs[128]
    out->d = Load16(block);
    out->m = Load16(block + 2);
    for (int j = 0; j < 8; ++j) ScaleMinK4(block + 4, j, &out->sc[j], &out->mn[j]);
    const uint8_t* qh = block + 16;
    const uint8_t* qs = block + (F::kBits == 5 ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      for (int l = 0; l < 32; ++l) {
        int32_t v = (qs[32 * (j / 2) + l] >> (j % 2 ? 4 : 0)) & 0x0f;
        if (F::kBits == 5) v |= ((qh[l] >> j) & 1) << 4;
        u[32 * j + l] = v;
      }
    }
  } else {
    out->d = Load16(block);
    out->m = F::kMin ? Load16(block + 2) : 0;
    if constexpr (F::kByte) {
      for (int i = 0; i < 32; ++i) u[i] = static_cast<int8_t>(block[2 + i]);
      return;
    }
    constexpr bool kHigh = F::kBits == 5;
    const uint8_t* qs = block + 2 + (F::kMin ? 2 : 0) + (kHigh ? 4 : 0);
    const uint32_t qh = kHigh ? Load32(block + 2 + (F::kMin ? 2 : 0)) : 0;
    for (int j = 0; j < 16; ++j) {
      u[j] = (qs[j] & 0x0f) | static_cast<int32_t>((qh >> j) & 1) << 4;
      u[j + 16] = (qs[j] >> 4) | static_cast<int32_t>((qh >> (j + 16)) & 1) << 4;
    }
  }
}

template <WeightQuant Q>
void PackPanel(const uint8_t* rows, int64_t count, int64_t k, uint8_t* panel) {
  using F = Format<Q>;
  const int64_t ggml_blocks = k / F::kGgmlElements;
  std::memset(panel, 0, F::PanelBytes(k));
  GgmlBlock unpacked;
  for (int64_t c = 0; c < count; ++c) {
    for (int64_t gb = 0; gb < ggml_blocks; ++gb) {
      UnpackGgmlBlock<Q>(rows + (c * ggml_blocks + gb) * F::kGgmlBytes, &unpacked);
      uint8_t* head = panel + gb * F::kSuperBytes;
      std::memcpy(head + 2 * c, &unpacked.d, 2);
      if (F::kMin) std::memcpy(head + F::kMinOffset + 2 * c, &unpacked.m, 2);
      for (int64_t j = 0; j < F::kSubBlocks; ++j) {
        const int64_t b = gb * F::kSubBlocks + j;
        uint8_t* sub = F::Sub(panel, b);
        if (F::kSubScales) {
          sub[c] = static_cast<uint8_t>(unpacked.sc[j]);
          sub[16 + c] = static_cast<uint8_t>(unpacked.mn[j]);
        } else if (F::kHalfScales) {
          sub[c] = static_cast<uint8_t>(unpacked.sc[2 * j]);
          sub[16 + c] = static_cast<uint8_t>(unpacked.sc[2 * j + 1]);
        }
        uint8_t* quants = sub + F::kQuantOffset;
        uint8_t* qh = sub + F::kHighOffset;
        const int32_t* u = unpacked.u + 32 * j;
        for (int kk = 0; kk < 32; ++kk) {
          const int jj = kk % 4;
          if constexpr (F::kByte) {
            quants[(kk / 4) * 64 + c * 4 + jj] = static_cast<uint8_t>(u[kk]);
          } else {
            const int g = (kk % 16) / 4;
            const bool hi = kk >= 16;
            quants[g * 64 + c * 4 + jj] |= static_cast<uint8_t>((u[kk] & 15) << (hi ? 4 : 0));
            if (F::kBits == 5) {
              qh[c * 4 + jj] |= static_cast<uint8_t>(((u[kk] >> 4) & 1) << (hi ? 4 + g : g));
            } else if (F::kBits == 6) {
              qh[(hi ? 64 : 0) + c * 4 + jj] |= static_cast<uint8_t>(((u[kk] >> 4) & 3) << (2 * g));
            }
          }
        }
      }
    }
  }
}

// u[c][kk] of one packed sub-block (Q8_0 signed).
template <WeightQuant Q>
inline int32_t PackedU(const uint8_t* sub, int64_t c, int kk) {
  using F = Format<Q>;
  const uint8_t* quants = sub + F::kQuantOffset;
  const int j = kk % 4;
  if constexpr (F::kByte) {
    return static_cast<int8_t>(quants[(kk / 4) * 64 + c * 4 + j]);
  } else {
    const int g = (kk % 16) / 4;
    const bool hi = kk >= 16;
    int32_t u = (quants[g * 64 + c * 4 + j] >> (hi ? 4 : 0)) & 15;
    if (F::kBits == 5) u |= ((sub[F::kHighOffset + c * 4 + j] >> (hi ? 4 + g : g)) & 1) << 4;
    if (F::kBits == 6) u |= ((sub[F::kHighOffset + (hi ? 64 : 0) + c * 4 + j] >> (2 * g)) & 3) << 4;
    return u;
  }
}

template <WeightQuant Q>
void DequantizeRow(const uint8_t* packed, int64_t row, int64_t k, float* out) {
  using F = Format<Q>;
  const int64_t blocks = k / kQuantBlock, c = row % kPanel;
  const uint8_t* panel = packed + row / kPanel * F::PanelBytes(k);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* head = F::Head(panel, b);
    const uint8_t* sub = F::Sub(panel, b);
    const float d = HalfToFloat(Load16(head + 2 * c));
    const float m = F::kMin ? HalfToFloat(Load16(head + F::kMinOffset + 2 * c)) : 0.0f;
    for (int kk = 0; kk < 32; ++kk) {
      const int32_t u = PackedU<Q>(sub, c, kk);
      float v;
      if constexpr (F::kSubScales) {  // (d * sc) * u - (dmin * m), as GGML
        const float scale = d * static_cast<float>(sub[c]);
        const float min = m * static_cast<float>(sub[16 + c]);
        const float du = scale * static_cast<float>(u);
        v = du - min;
      } else if constexpr (F::kHalfScales) {  // (d * sc) * (u - 32)
        const float scale =
            d * static_cast<float>(static_cast<int8_t>(sub[(kk >= 16 ? 16 : 0) + c]));
        v = scale * static_cast<float>(u - F::kZero);
      } else {
        const float du = d * static_cast<float>(u - F::kZero);
        v = F::kMin ? du + m : du;
      }
      out[b * 32 + kk] = v;
    }
  }
}

// ---- Scalar: the definition. ----

template <WeightQuant Q>
void GemmScalarQ(const QuantizedRows& x, int64_t rows, const uint8_t* packed, int64_t p0,
                 int64_t p1, int64_t n, float* out, int64_t os) {
  using F = Format<Q>;
  const int64_t blocks = x.k / kQuantBlock, ps = F::PanelBytes(x.k);
  for (int64_t m = 0; m < rows; ++m) {
    const int8_t* q = x.q + m * x.k;
    const ActivationBlock* a = x.blocks + m * blocks;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* panel = packed + p * ps;
      float tile[kPanel];
      for (int64_t c = 0; c < kPanel; ++c) {
        float acc = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* head = F::Head(panel, b);
          const uint8_t* sub = F::Sub(panel, b);
          int32_t lo = 0, hi = 0;
          for (int kk = 0; kk < 16; ++kk) lo += q[b * 32 + kk] * PackedU<Q>(sub, c, kk);
          for (int kk = 16; kk < 32; ++kk) hi += q[b * 32 + kk] * PackedU<Q>(sub, c, kk);
          int32_t isum;
          if (F::kSubScales) {
            isum = sub[c] * (lo + hi);
          } else if (F::kHalfScales) {
            isum = static_cast<int8_t>(sub[c]) * (lo - F::kZero * a[b].sum_lo) +
                   static_cast<int8_t>(sub[16 + c]) * (hi - F::kZero * (a[b].sum - a[b].sum_lo));
          } else {
            isum = lo + hi - F::kZero * a[b].sum;
          }
          const float dw = HalfToFloat(Load16(head + 2 * c));
          acc = std::fma(dw * a[b].d, static_cast<float>(isum), acc);
          if (F::kMin) {
            const float mw = HalfToFloat(Load16(head + F::kMinOffset + 2 * c));
            if (F::kSubScales) {
              acc = std::fma(-(mw * static_cast<float>(sub[16 + c])), a[b].s, acc);
            } else {
              acc = std::fma(mw, a[b].s, acc);
            }
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

// A sub-block's 8 groups of a half panel (rows 8h..8h+7) as unsigned bytes (Q8_0: |u|, with
// the signs in `sign`).
template <WeightQuant Q>
FERRY_QAVX2 inline void UnpackAvx2(const uint8_t* sub, int h, __m256i* w, __m256i* sign) {
  using F = Format<Q>;
  const uint8_t* quants = sub + F::kQuantOffset + 32 * h;
  if constexpr (F::kByte) {
    FERRY_UNROLL
    for (int g = 0; g < 8; ++g) {
      sign[g] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * g));
      w[g] = _mm256_abs_epi8(sign[g]);
    }
  } else {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i qh0 = _mm256_setzero_si256(), qh1 = _mm256_setzero_si256();
    if (F::kBits >= 5) {
      qh0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + F::kHighOffset + 32 * h));
    }
    if (F::kBits == 6) {
      qh1 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub + F::kHighOffset + 64 + 32 * h));
    }
    FERRY_UNROLL
    for (int g = 0; g < 4; ++g) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + 64 * g));
      w[g] = _mm256_and_si256(raw, low);
      w[g + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      if (F::kBits == 5) {
        const __m256i one = _mm256_set1_epi8(1);
        w[g] = _mm256_or_si256(
            w[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh0, g), one), 4));
        w[g + 4] = _mm256_or_si256(
            w[g + 4], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh0, g + 4), one), 4));
      } else if (F::kBits == 6) {
        const __m256i three = _mm256_set1_epi8(3);
        w[g] = _mm256_or_si256(
            w[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh0, 2 * g), three), 4));
        w[g + 4] = _mm256_or_si256(
            w[g + 4], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh1, 2 * g), three), 4));
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
      const uint8_t* head = F::Head(panel0 + p * panel_stride, b);
      const uint8_t* sub = F::Sub(panel0 + p * panel_stride, b);
      FERRY_UNROLL
      for (int h = 0; h < 2; ++h) {
        __m256i w[8], sign[8];
        UnpackAvx2<Q>(sub, h, w, sign);
        const __m256 dw =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(head + 16 * h)));
        __m256 mw = _mm256_setzero_ps();
        if (F::kMin) {
          mw = _mm256_cvtph_ps(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(head + F::kMinOffset + 16 * h)));
        }
        // The K-quants' integer scales as floats (exact products, as in TileVnni).
        __m256 sc_lo = _mm256_setzero_ps(), sc_hi = _mm256_setzero_ps();
        if (F::kSubScales) {
          const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 8 * h));
          const __m128i mn = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 16 + 8 * h));
          sc_lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc));
          mw = _mm256_mul_ps(mw, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)));  // dmin * m_j
        } else if (F::kHalfScales) {
          sc_lo = _mm256_cvtepi32_ps(
              _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 8 * h))));
          sc_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sub + 16 + 8 * h))));
        }
        FERRY_UNROLL
        for (int r = 0; r < MR; ++r) {
          const int8_t* q = x.q + r * x.k + b * 32;
          const ActivationBlock& ab = x.blocks[r * blocks + b];
          __m256i s_lo = _mm256_setzero_si256(), s_hi = _mm256_setzero_si256();
          FERRY_UNROLL
          for (int g = 0; g < 4; ++g) {
            int32_t lo, hi;
            std::memcpy(&lo, q + 4 * g, 4);
            std::memcpy(&hi, q + 16 + 4 * g, 4);
            __m256i a_lo = _mm256_set1_epi32(lo), a_hi = _mm256_set1_epi32(hi);
            if (F::kByte) {
              a_lo = _mm256_sign_epi8(a_lo, sign[g]);
              a_hi = _mm256_sign_epi8(a_hi, sign[g + 4]);
            }
            s_lo =
                _mm256_add_epi32(s_lo, _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], a_lo), ones));
            s_hi = _mm256_add_epi32(s_hi,
                                    _mm256_madd_epi16(_mm256_maddubs_epi16(w[g + 4], a_hi), ones));
          }
          __m256 isum;
          if (F::kHalfScales) {
            s_lo = _mm256_sub_epi32(s_lo, _mm256_set1_epi32(F::kZero * ab.sum_lo));
            s_hi = _mm256_sub_epi32(s_hi, _mm256_set1_epi32(F::kZero * (ab.sum - ab.sum_lo)));
            isum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s_hi), sc_hi,
                                   _mm256_mul_ps(_mm256_cvtepi32_ps(s_lo), sc_lo));
          } else {
            __m256i s = _mm256_add_epi32(s_lo, s_hi);
            if (F::kZero != 0) s = _mm256_sub_epi32(s, _mm256_set1_epi32(F::kZero * ab.sum));
            isum = _mm256_cvtepi32_ps(s);
            if (F::kSubScales) isum = _mm256_mul_ps(isum, sc_lo);
          }
          const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(ab.d));
          acc[r][p][h] = _mm256_fmadd_ps(scale, isum, acc[r][p][h]);
          if (F::kSubScales) {
            acc[r][p][h] = _mm256_fnmadd_ps(mw, _mm256_set1_ps(ab.s), acc[r][p][h]);
          } else if (F::kMin) {
            acc[r][p][h] = _mm256_fmadd_ps(mw, _mm256_set1_ps(ab.s), acc[r][p][h]);
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
  const int64_t ps = Format<Q>::PanelBytes(x.k);
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

// A sub-block's 8 groups as unsigned bytes: Q8_0 as u + 128 (so z becomes 128).
template <WeightQuant Q>
FERRY_QVNNI inline void UnpackVnni(const uint8_t* sub, __m512i* w) {
  using F = Format<Q>;
  const uint8_t* quants = sub + F::kQuantOffset;
  if constexpr (F::kByte) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    FERRY_UNROLL
    for (int g = 0; g < 8; ++g) w[g] = _mm512_xor_si512(_mm512_loadu_si512(quants + 64 * g), flip);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512i qh0 = _mm512_setzero_si512(), qh1 = _mm512_setzero_si512();
    if (F::kBits >= 5) qh0 = _mm512_loadu_si512(sub + F::kHighOffset);
    if (F::kBits == 6) qh1 = _mm512_loadu_si512(sub + F::kHighOffset + 64);
    FERRY_UNROLL
    for (int g = 0; g < 4; ++g) {
      const __m512i raw = _mm512_loadu_si512(quants + 64 * g);
      w[g] = _mm512_and_si512(raw, low);
      w[g + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
      if (F::kBits == 5) {
        const __m512i one = _mm512_set1_epi8(1);
        w[g] = _mm512_or_si512(
            w[g], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh0, g), one), 4));
        w[g + 4] = _mm512_or_si512(
            w[g + 4], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh0, g + 4), one), 4));
      } else if (F::kBits == 6) {
        const __m512i three = _mm512_set1_epi8(3);
        w[g] = _mm512_or_si512(
            w[g], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh0, 2 * g), three), 4));
        w[g + 4] = _mm512_or_si512(
            w[g + 4], _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh1, 2 * g), three), 4));
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
      const uint8_t* head = F::Head(panel0 + p * panel_stride, b);
      const uint8_t* sub = F::Sub(panel0 + p * panel_stride, b);
      if (MR == 1) {
        // One row (decode) streams the panels once: fetch ahead of the hardware prefetcher.
        const char* ahead = reinterpret_cast<const char*>(sub) + kPrefetchAhead;
        FERRY_UNROLL
        for (int64_t l = 0; l < F::kSubBytes; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
        if (F::kSuper && b % F::kSubBlocks == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(head) + kPrefetchAhead, _MM_HINT_T0);
        }
      }
      __m512i w[8];
      UnpackVnni<Q>(sub, w);
      const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(head)));
      __m512 mw = _mm512_setzero_ps();
      if (F::kMin) {
        mw = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(head + F::kMinOffset)));
      }
      // The K-quants' integer scales as floats: products with the integer sums are exact in
      // fp32 (below 2^24), so they equal the definition's integer products.
      __m512 sc_lo = _mm512_setzero_ps(), sc_hi = _mm512_setzero_ps();
      if (F::kSubScales) {
        sc_lo = _mm512_cvtepi32_ps(
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub))));
        const __m512i mn =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + 16)));
        mw = _mm512_mul_ps(mw, _mm512_cvtepi32_ps(mn));  // dmin * m_j
      } else if (F::kHalfScales) {
        sc_lo = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub))));
        sc_hi = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sub + 16))));
      }
      FERRY_UNROLL
      for (int r = 0; r < MR; ++r) {
        const int8_t* q = x.q + r * x.k + b * 32;
        const ActivationBlock& ab = x.blocks[r * blocks + b];
        // Two chains of four (k < 16 and k >= 16): each VPDPBUSD waits on the one before it.
        __m512i s_lo = _mm512_setzero_si512(), s_hi = _mm512_setzero_si512();
        FERRY_UNROLL
        for (int g = 0; g < 4; ++g) {
          int32_t lo, hi;
          std::memcpy(&lo, q + 4 * g, 4);
          std::memcpy(&hi, q + 16 + 4 * g, 4);
          s_lo = _mm512_dpbusd_epi32(s_lo, w[g], _mm512_set1_epi32(lo));
          s_hi = _mm512_dpbusd_epi32(s_hi, w[g + 4], _mm512_set1_epi32(hi));
        }
        __m512 isum;
        if (F::kHalfScales) {
          s_lo = _mm512_sub_epi32(s_lo, _mm512_set1_epi32(kZero * ab.sum_lo));
          s_hi = _mm512_sub_epi32(s_hi, _mm512_set1_epi32(kZero * (ab.sum - ab.sum_lo)));
          isum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_hi), sc_hi,
                                 _mm512_mul_ps(_mm512_cvtepi32_ps(s_lo), sc_lo));
        } else {
          __m512i s = _mm512_add_epi32(s_lo, s_hi);
          if (kZero != 0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(kZero * ab.sum));
          isum = _mm512_cvtepi32_ps(s);
          if (F::kSubScales) isum = _mm512_mul_ps(isum, sc_lo);
        }
        const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(ab.d));
        acc[r][p] = _mm512_fmadd_ps(scale, isum, acc[r][p]);
        if (F::kSubScales) {
          acc[r][p] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(ab.s), acc[r][p]);
        } else if (F::kMin) {
          acc[r][p] = _mm512_fmadd_ps(mw, _mm512_set1_ps(ab.s), acc[r][p]);
        }
      }
    }
  }
  StoreTile512<MR, NP>(acc, first_col, n, out, os);
}

template <WeightQuant Q, int MR, int NP>
FERRY_QVNNI void RowsVnni(const QuantizedRows& x, const uint8_t* packed, int64_t p0, int64_t p1,
                          int64_t n, float* out, int64_t os) {
  const int64_t ps = Format<Q>::PanelBytes(x.k);
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

int64_t GgmlQuantBlockElements(WeightQuant quant) {
  return Dispatch(quant, [](auto q) { return Format<decltype(q)::value>::kGgmlElements; });
}

int64_t GgmlQuantBlockBytes(WeightQuant quant) {
  return Dispatch(quant, [](auto q) { return Format<decltype(q)::value>::kGgmlBytes; });
}

int64_t QuantPanelBytes(WeightQuant quant, int64_t k) {
  return Dispatch(quant, [k](auto q) { return Format<decltype(q)::value>::PanelBytes(k); });
}

int64_t PackedQuantBytes(WeightQuant quant, int64_t n, int64_t k) {
  return (n + kPanel - 1) / kPanel * QuantPanelBytes(quant, k);
}

void PackQuantPanel(WeightQuant quant, const uint8_t* rows, int64_t count, int64_t k,
                    uint8_t* panel) {
  CHECK(count >= 0 && count <= kPanel && k % GgmlQuantBlockElements(quant) == 0);
  Dispatch(quant, [&](auto q) { PackPanel<decltype(q)::value>(rows, count, k, panel); });
}

void DequantizePackedRow(WeightQuant quant, const uint8_t* packed, int64_t row, int64_t k,
                         float* out) {
  Dispatch(quant, [&](auto q) { DequantizeRow<decltype(q)::value>(packed, row, k, out); });
}

void QuantizeActivationRow(const float* x, int64_t k, int8_t* q, ActivationBlock* blocks) {
  for (int64_t b = 0; b < k / kQuantBlock; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (int i = 0; i < kQuantBlock; ++i) {
      const float a = std::fabs(xb[i]);
      amax = a > amax ? a : amax;
    }
    const float db = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t total = 0, total_lo = 0;
    for (int i = 0; i < kQuantBlock; ++i) {
      float r = std::nearbyint(xb[i] * id);  // the current rounding mode: nearest, ties to even
      r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
      const int32_t v = r == r ? static_cast<int32_t>(r) : 0;  // NaN (a NaN activation): 0
      q[b * kQuantBlock + i] = static_cast<int8_t>(v);
      total += v;
      if (i == 15) total_lo = total;
    }
    ActivationBlock& out = blocks[b];
    out.d = HalfToFloat(FloatToHalf(db));
    out.sum = total;
    out.sum_lo = total_lo;
    out.s = HalfToFloat(FloatToHalf(db * static_cast<float>(total)));
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

bool CpuHasF16c() {
#ifdef FERRY_HAVE_X86
  // CPUID.1:ECX[29] (clang's __builtin_cpu_supports knows no "f16c").
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1);
#else
  return false;
#endif
}

bool QuantIsaSupported(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar:
      return true;
#ifdef FERRY_HAVE_X86
    case QuantIsa::kAvx2:
      return CpuSupports(CpuIsa::kAvx2) && CpuHasF16c();
    case QuantIsa::kAvx512Vnni: {
      // CPUID.(EAX=7,ECX=0):ECX[11] AVX512_VNNI.
      unsigned a, b, c, d;
      return CpuSupports(CpuIsa::kAvx512) && QuantIsaSupported(QuantIsa::kAvx2) &&
             __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((c >> 11) & 1);
    }
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
