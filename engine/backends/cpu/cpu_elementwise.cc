// The CPU backend's elementwise and reduction kernels (cpu_kernels.h): softmax's scale-and-max
// and exp-and-sum, RMSNorm's sum of squares and the SiLU-gated product, in each instruction-set
// variant (cpu_kernels_internal.h), all in cpu_kernels.h's canonical order (16 partial sums and
// a fixed tree; Exp step for step).

#include <cmath>
#include <cstdint>
#include <limits>

#include "engine/backends/cpu/cpu_kernels.h"
#include "engine/backends/cpu/cpu_kernels_internal.h"
#include "engine/common/float_math.h"

namespace ferry {
namespace cpu_internal {
namespace {

// The fixed combination tree of the 16 partial sums of SumSquares.
inline float ReduceLanes(float* a) {
  for (int j = 0; j < 8; ++j) a[j] += a[j + 8];
  for (int j = 0; j < 4; ++j) a[j] += a[j + 4];
  for (int j = 0; j < 2; ++j) a[j] += a[j + 2];
  return a[0] + a[1];
}

}  // namespace

// ---- Scalar: the definition. ----

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

#ifdef FERRY_HAVE_X86

// ---- AVX2 + FMA: 8 lanes. ----

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

namespace {

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

}  // namespace

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

// ---- AVX-512: 16 lanes. ----

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

#endif  // FERRY_HAVE_X86

}  // namespace cpu_internal
}  // namespace ferry
