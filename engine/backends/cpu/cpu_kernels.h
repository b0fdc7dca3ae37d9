// The CPU backend's inner loops, in one canonical reduction order that every instruction-set
// variant reproduces bit for bit (ARCHITECTURE.md §4):
//
//   Dot(x, w, n): 16 partial sums; element k is added to partial k mod 16 with a fused
//   multiply-add, in increasing k; then the partials are combined by a fixed tree:
//   a[j] += a[j + 8] (j < 8), a[j] += a[j + 4] (j < 4), a[j] += a[j + 2] (j < 2), a[0] + a[1].
//   bf16 inputs are widened to fp32 exactly before the multiply.
//
//   Axpy(a, v, out, n): out[d] = fma(a, v[d], out[d]) for each d (elementwise, no reduction).
//
// The scalar variant is the definition; the AVX2 variant keeps two 8-lane accumulators (lanes
// 0-7 and 8-15 of the 16 partials) and finishes with the scalar tail and tree. A test forces each
// variant and compares bits. The variant is chosen at run time from the CPU (BestCpuIsa), or
// forced with FERRY_CPU_ISA=scalar|avx2.

#ifndef FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_H_
#define FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

enum class CpuIsa { kScalar, kAvx2 };

const char* CpuIsaName(CpuIsa isa);
// Whether this CPU can run `isa`.
bool CpuSupports(CpuIsa isa);
// FERRY_CPU_ISA when set (an error if unknown or unsupported here), else the widest supported.
absl::StatusOr<CpuIsa> SelectCpuIsa();
// Every variant this CPU can run, scalar first.
std::vector<CpuIsa> SupportedCpuIsas();

struct CpuKernels {
  float (*dot_f32)(const float* x, const float* w, int64_t n);
  float (*dot_bf16)(const float* x, const uint16_t* w, int64_t n);
  void (*axpy_f32)(float a, const float* v, float* out, int64_t n);
  void (*axpy_bf16)(float a, const uint16_t* v, float* out, int64_t n);
};

const CpuKernels& CpuKernelsFor(CpuIsa isa);

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_H_
