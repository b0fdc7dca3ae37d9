// The instruction-set variants behind CpuKernels (cpu_kernels.h), declared for the dispatch tables
// in cpu_kernels.cc and defined by concept: cpu_gemm.cc (the fp32- and bf16-weight matrix
// products and the bf16 rounding of their activations), cpu_attention.cc (attention's scores and
// weighted sums over KV cache rows) and cpu_elementwise.cc (softmax's scale-max and exp-sum,
// RMSNorm's sum of squares, SiLU). Also the vector loads and masks those files share.
//
// Internal to engine/backends/cpu. Stateless functions over caller-owned buffers: thread-safe on
// disjoint outputs; they cannot fail (shapes and strides are the caller's contract, as documented
// on the CpuKernels slots). A variant marked FERRY_AVX2, FERRY_AVX512 or FERRY_AVX512BF16 runs
// only where CpuSupports says its instruction set is present. Every variant computes each output
// element in the canonical order of cpu_kernels.h, so all agree bit for bit.

#ifndef FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_INTERNAL_H_
#define FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_INTERNAL_H_

#include <cstdint>

#include "engine/backends/cpu/cpu_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define FERRY_HAVE_X86 1
#endif

#ifdef FERRY_HAVE_X86
// The instruction sets of the vector variants, per function (the rest of the binary stays
// baseline x86-64, so it runs on any CPU).
#define FERRY_AVX2 __attribute__((target("avx2,fma")))
#define FERRY_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))
#define FERRY_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))
#endif

// Hidden visibility: nothing here is used outside the cpu_kernels library, and a hidden function
// may be inlined into its callers in -fPIC builds too (the vector variants' scalar tails), as when
// all of this was one file; with default visibility such a tail would be called through the PLT.
#pragma GCC visibility push(hidden)

namespace ferry {
namespace cpu_internal {

// ---- Scalar: the definition. ----

// cpu_gemm.cc: CpuKernels::gemm_f32 and gemm_bf16.
void GemmScalar(const float* x, int64_t xs, int64_t rows, int64_t k, const float* packed,
                int64_t p0, int64_t p1, int64_t n, float* out, int64_t os);
void GemmBf16Scalar(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                    const uint16_t* packed, int64_t p0, int64_t p1, int64_t n, float* out,
                    int64_t os);

// cpu_attention.cc, for T = float and T = uint16_t (bf16): dot_columns_* and weighted_rows_*.
template <typename T>
void DotColumnsScalar(const float* q, int64_t qs, int64_t queries, const T* kt, int64_t ld,
                      int64_t dims, int64_t count, float* scores, int64_t ss);
template <typename T>
void WeightedRowsScalar(const float* p, int64_t ps, int64_t queries, const T* v, int64_t ld,
                        int64_t count, int64_t dims, float* acc, int64_t as);

// cpu_elementwise.cc: scale_max, exp_sum, sum_squares, silu_mul. (round_bf16's scalar variant is
// RoundActivationsBf16 itself.)
float ScaleMaxScalar(float* x, int64_t n, float scale);
float ExpSumScalar(float* x, int64_t n, float sub);
float SumSquaresScalar(const float* x, int64_t n);
void SiluMulScalar(const float* g, const float* u, float* out, int64_t n);

#ifdef FERRY_HAVE_X86

// ---- Vector helpers shared by the files above. ----

// 8 fp32 lanes from 8 floats or 8 bf16 values (widened exactly).
FERRY_AVX2 inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
FERRY_AVX2 inline __m256 Load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 16 fp32 lanes from 16 floats or 16 bf16 values (widened exactly).
FERRY_AVX512 inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
FERRY_AVX512 inline __m512 Load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The first `valid` of 16 lanes (none for valid <= 0, all for valid >= 16).
inline __mmask16 LaneMask(int64_t valid) {
  return valid >= 16 ? 0xFFFF : valid <= 0 ? 0 : static_cast<__mmask16>((1u << valid) - 1);
}

// ---- AVX2 + FMA: 8 lanes. ----

// cpu_gemm.cc; GemmAvx2 is defined for T = float.
template <typename T>
FERRY_AVX2 void GemmAvx2(const float* x, int64_t xs, int64_t rows, int64_t k, const T* packed,
                         int64_t p0, int64_t p1, int64_t n, float* out, int64_t os);
FERRY_AVX2 void GemmBf16Avx2(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                             const uint16_t* packed, int64_t p0, int64_t p1, int64_t n, float* out,
                             int64_t os);
FERRY_AVX2 void RoundBf16Avx2(const float* x, int64_t k, uint16_t* out);

// cpu_attention.cc, for T = float and T = uint16_t.
template <typename T>
FERRY_AVX2 void DotColumnsAvx2(const float* q, int64_t qs, int64_t queries, const T* kt, int64_t ld,
                               int64_t dims, int64_t count, float* scores, int64_t ss);
template <typename T>
FERRY_AVX2 void WeightedRowsAvx2(const float* p, int64_t ps, int64_t queries, const T* v,
                                 int64_t ld, int64_t count, int64_t dims, float* acc, int64_t as);

// cpu_elementwise.cc.
FERRY_AVX2 float SumSquaresAvx2(const float* x, int64_t n);
FERRY_AVX2 float ScaleMaxAvx2(float* x, int64_t n, float scale);
FERRY_AVX2 float ExpSumAvx2(float* x, int64_t n, float sub);
FERRY_AVX2 void SiluMulAvx2(const float* g, const float* u, float* out, int64_t n);

// ---- AVX-512: 16 lanes. ----

// cpu_gemm.cc; GemmAvx512 is defined for T = float.
template <typename T>
FERRY_AVX512 void GemmAvx512(const float* x, int64_t xs, int64_t rows, int64_t k, const T* packed,
                             int64_t p0, int64_t p1, int64_t n, float* out, int64_t os);
FERRY_AVX512 void GemmBf16Avx512(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                                 const uint16_t* packed, int64_t p0, int64_t p1, int64_t n,
                                 float* out, int64_t os);

// cpu_attention.cc, for T = float and T = uint16_t.
template <typename T>
FERRY_AVX512 void DotColumnsAvx512(const float* q, int64_t qs, int64_t queries, const T* kt,
                                   int64_t ld, int64_t dims, int64_t count, float* scores,
                                   int64_t ss);
template <typename T>
FERRY_AVX512 void WeightedRowsAvx512(const float* p, int64_t ps, int64_t queries, const T* v,
                                     int64_t ld, int64_t count, int64_t dims, float* acc,
                                     int64_t as);

// cpu_elementwise.cc.
FERRY_AVX512 float ScaleMaxAvx512(float* x, int64_t n, float scale);
FERRY_AVX512 float SumSquaresAvx512(const float* x, int64_t n);

// ---- AVX512-BF16: VDPBF16PS. ----

// cpu_gemm.cc.
FERRY_AVX512BF16 void GemmBf16Dpbf16(const uint16_t* xb, int64_t xs, int64_t rows, int64_t k2,
                                     const uint16_t* packed, int64_t p0, int64_t p1, int64_t n,
                                     float* out, int64_t os);

#endif  // FERRY_HAVE_X86

}  // namespace cpu_internal
}  // namespace ferry

#pragma GCC visibility pop

#endif  // FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_INTERNAL_H_
