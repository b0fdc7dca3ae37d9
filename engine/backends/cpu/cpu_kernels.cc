// Choosing the CPU kernels' variant: what this CPU supports, FERRY_CPU_ISA, and the tables that
// bind each CpuKernels slot to its variant (defined in cpu_gemm.cc, cpu_attention.cc and
// cpu_elementwise.cc; declared in cpu_kernels_internal.h).

#include "engine/backends/cpu/cpu_kernels.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/cpu/cpu_kernels_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ferry {
namespace cpu_internal {
namespace {

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

}  // namespace
}  // namespace cpu_internal

namespace {

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
  if (isa == CpuIsa::kAvx2) return cpu_internal::kAvx2Kernels;
  if (isa == CpuIsa::kAvx512) return cpu_internal::kAvx512Kernels;
  if (isa == CpuIsa::kAvx512Bf16) return cpu_internal::kAvx512Bf16Kernels;
#endif
  return cpu_internal::kScalarKernels;
}

}  // namespace ferry
