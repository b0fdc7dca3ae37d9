#include "engine/backends/cpu/cpu_kernels.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/common/float_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define FERRY_HAVE_X86 1
#endif

namespace ferry {
namespace {

constexpr int kLanes = 16;

// The fixed combination tree of the 16 partial sums.
inline float ReduceLanes(float* a) {
  for (int j = 0; j < 8; ++j) a[j] += a[j + 8];
  for (int j = 0; j < 4; ++j) a[j] += a[j + 4];
  for (int j = 0; j < 2; ++j) a[j] += a[j + 2];
  return a[0] + a[1];
}

// ---- Scalar: the definition. ----

float DotF32Scalar(const float* x, const float* w, int64_t n) {
  float a[kLanes] = {};
  for (int64_t k = 0; k < n; ++k) a[k % kLanes] = std::fma(x[k], w[k], a[k % kLanes]);
  return ReduceLanes(a);
}

float DotBf16Scalar(const float* x, const uint16_t* w, int64_t n) {
  float a[kLanes] = {};
  for (int64_t k = 0; k < n; ++k) a[k % kLanes] = std::fma(x[k], Bf16ToFloat(w[k]), a[k % kLanes]);
  return ReduceLanes(a);
}

void AxpyF32Scalar(float s, const float* v, float* out, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] = std::fma(s, v[d], out[d]);
}

void AxpyBf16Scalar(float s, const uint16_t* v, float* out, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] = std::fma(s, Bf16ToFloat(v[d]), out[d]);
}

const CpuKernels kScalarKernels = {DotF32Scalar, DotBf16Scalar, AxpyF32Scalar, AxpyBf16Scalar};

// ---- AVX2 + FMA. ----
#ifdef FERRY_HAVE_X86

#define FERRY_AVX2 __attribute__((target("avx2,fma")))

FERRY_AVX2 inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

FERRY_AVX2 float DotF32Avx2(const float* x, const float* w, int64_t n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const int64_t full = n - n % kLanes;
  for (int64_t k = 0; k < full; k += kLanes) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), _mm256_loadu_ps(w + k + 8), hi);
  }
  alignas(32) float a[kLanes];
  _mm256_store_ps(a, lo);
  _mm256_store_ps(a + 8, hi);
  for (int64_t k = full; k < n; ++k) a[k - full] = std::fma(x[k], w[k], a[k - full]);
  return ReduceLanes(a);
}

FERRY_AVX2 float DotBf16Avx2(const float* x, const uint16_t* w, int64_t n) {
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const int64_t full = n - n % kLanes;
  for (int64_t k = 0; k < full; k += kLanes) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), LoadBf16x8(w + k), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), LoadBf16x8(w + k + 8), hi);
  }
  alignas(32) float a[kLanes];
  _mm256_store_ps(a, lo);
  _mm256_store_ps(a + 8, hi);
  for (int64_t k = full; k < n; ++k) a[k - full] = std::fma(x[k], Bf16ToFloat(w[k]), a[k - full]);
  return ReduceLanes(a);
}

FERRY_AVX2 void AxpyF32Avx2(float s, const float* v, float* out, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    _mm256_storeu_ps(out + d,
                     _mm256_fmadd_ps(sv, _mm256_loadu_ps(v + d), _mm256_loadu_ps(out + d)));
  }
  for (; d < n; ++d) out[d] = std::fma(s, v[d], out[d]);
}

FERRY_AVX2 void AxpyBf16Avx2(float s, const uint16_t* v, float* out, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    _mm256_storeu_ps(out + d, _mm256_fmadd_ps(sv, LoadBf16x8(v + d), _mm256_loadu_ps(out + d)));
  }
  for (; d < n; ++d) out[d] = std::fma(s, Bf16ToFloat(v[d]), out[d]);
}

const CpuKernels kAvx2Kernels = {DotF32Avx2, DotBf16Avx2, AxpyF32Avx2, AxpyBf16Avx2};

#endif  // FERRY_HAVE_X86

}  // namespace

const char* CpuIsaName(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "scalar"; }

bool CpuSupports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
#ifdef FERRY_HAVE_X86
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
      return false;
#endif
  }
  return false;
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2}) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

absl::StatusOr<CpuIsa> SelectCpuIsa() {
  const char* forced = std::getenv("FERRY_CPU_ISA");
  if (forced == nullptr || *forced == '\0') return SupportedCpuIsas().back();
  for (CpuIsa isa : {CpuIsa::kScalar, CpuIsa::kAvx2}) {
    if (std::strcmp(forced, CpuIsaName(isa)) != 0) continue;
    if (!CpuSupports(isa)) {
      return absl::FailedPreconditionError(
          absl::StrCat("FERRY_CPU_ISA=", forced, ": this CPU does not support it"));
    }
    return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("FERRY_CPU_ISA=", forced, ": unknown (scalar, avx2)"));
}

const CpuKernels& CpuKernelsFor(CpuIsa isa) {
#ifdef FERRY_HAVE_X86
  if (isa == CpuIsa::kAvx2) return kAvx2Kernels;
#endif
  return kScalarKernels;
}

}  // namespace ferry
