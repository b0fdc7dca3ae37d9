// The CPU backend's inner loops. Every instruction-set variant computes every output element in
// the same canonical order, so results are bit-identical whatever variant the CPU selects
// (ARCHITECTURE.md §4). The scalar variant is the definition:
//
//   Products (fp32-weight matrix products, attention scores, attention outputs): one fp32
//   accumulator per output element, starting at +0, updated with a fused multiply-add per term
//   in increasing order of the summed index. bf16 inputs are widened to fp32 exactly first.
//   Vector variants put different output elements in different lanes; no lane ever holds part of
//   another element's sum, so the order cannot depend on the vector width or the number of rows.
//
//   bf16-weight matrix products (the serving configuration): activations are rounded to bf16
//   (nearest even) as weights are, K is taken in pairs (2i, 2i+1), and per output element
//   acc = +0; for each pair in increasing i: acc = fma(x[2i+1], w[2i+1], acc);
//   acc = fma(x[2i], w[2i], acc); with subnormal inputs read as zero and subnormal results
//   flushed to zero (x86 MXCSR DAZ + FTZ). This is exactly what AVX512-BF16's VDPBF16PS
//   computes (checked bit for bit against the hardware on 32M random lanes, subnormals
//   included), so that variant runs at the bf16 dot-product rate; the others reproduce it with
//   two FMAs per pair under DAZ + FTZ. Bit-identity across variants holds on x86.
//
//   SumSquares (RMSNorm) and ExpSum (the softmax denominator): 16 partial sums, term i added to
//   partial i mod 16 in increasing i (x[i]^2 with a fused multiply-add; Exp(x[i] - max) with an
//   add); then a[j] += a[j + 8] (j < 8), a[j] += a[j + 4] (j < 4), a[j] += a[j + 2] (j < 2),
//   a[0] + a[1].
//
//   Exp: float_math.h, step for step.
//
// Weights are packed once at load into panels of kPanel output columns: panel p holds, for each
// k in order, the kPanel values w[16p + c][k] (c < 16; zero beyond the last column), so a vector
// load gives one k of 8 or 16 adjacent outputs.
//
// The variant is chosen at run time from the CPU (the widest supported) or forced with
// FERRY_CPU_ISA=scalar|avx2|avx512|avx512bf16.
//
// Code: cpu_gemm.cc (packing, bf16 rounding, the products), cpu_attention.cc (dot_columns_*,
// weighted_rows_*), cpu_elementwise.cc (scale_max, exp_sum, sum_squares, silu_mul), each with all
// its variants; cpu_kernels.cc detects the CPU and holds the per-variant CpuKernels tables.

#ifndef FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_H_
#define FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry {

enum class CpuIsa { kScalar, kAvx2, kAvx512, kAvx512Bf16 };

constexpr int64_t kPanel = 16;

const char* CpuIsaName(CpuIsa isa);
// Whether this CPU can run `isa`.
bool CpuSupports(CpuIsa isa);
// FERRY_CPU_ISA when set (an error if unknown or unsupported here), else the widest supported.
absl::StatusOr<CpuIsa> SelectCpuIsa();
// Every variant this CPU can run, scalar first.
std::vector<CpuIsa> SupportedCpuIsas();

// Elements of the packed form of an n x k matrix.
inline int64_t PackedElements(int64_t n, int64_t k) {
  return (n + kPanel - 1) / kPanel * kPanel * k;
}
// Packs row-major fp32 w (n x k) into panels.
void PackPanels(const float* w, int64_t n, int64_t k, float* packed);

// bf16 weights: K padded to even; panel p holds, for each pair i, the 16 columns' (w[c][2i],
// w[c][2i + 1]) next to each other (one 32-bit lane per column, as VDPBF16PS reads them).
inline int64_t PairedK(int64_t k) { return (k + 1) / 2 * 2; }
inline int64_t PackedElementsBf16(int64_t n, int64_t k) {
  return (n + kPanel - 1) / kPanel * kPanel * PairedK(k);
}
void PackPanelsBf16(const uint16_t* w, int64_t n, int64_t k, uint16_t* packed);
// Element (row, k) of a bf16 packed matrix.
inline int64_t PackedIndexBf16(int64_t row, int64_t k, int64_t cols) {
  return row / kPanel * kPanel * PairedK(cols) + k / 2 * 2 * kPanel + row % kPanel * 2 + k % 2;
}
// x (k floats) rounded to bf16, zero-padded to PairedK(k).
void RoundActivationsBf16(const float* x, int64_t k, uint16_t* out);

struct CpuKernels {
  // out[m][c] = sum_k x[m][k] * w[16p + c][k] for rows m < rows, panels p in
  // [panel_begin, panel_end) and columns 16p + c < n; x rows `x_stride` floats apart, out rows
  // `out_stride` floats apart, out pointing at column 0.
  void (*gemm_f32)(const float* x, int64_t x_stride, int64_t rows, int64_t k, const float* packed,
                   int64_t panel_begin, int64_t panel_end, int64_t n, float* out,
                   int64_t out_stride);
  // The bf16-weight product: xb holds rows of bf16 activations (RoundActivationsBf16), `k2` =
  // PairedK(k) wide, `xb_stride` apart; packed is PackPanelsBf16's layout.
  void (*gemm_bf16)(const uint16_t* xb, int64_t xb_stride, int64_t rows, int64_t k2,
                    const uint16_t* packed, int64_t panel_begin, int64_t panel_end, int64_t n,
                    float* out, int64_t out_stride);
  // Attention's products, for `queries` query vectors at once so that every key and value row
  // read serves all of them (the heads of a KV group at several positions).
  // scores[g * ss + j] = sum_d q[g * qs + d] * kt[d * ld + j] for g < queries, j < count: dot
  // products with `count` keys stored column-wise (d-major), as the KV cache stores keys.
  void (*dot_columns_f32)(const float* q, int64_t qs, int64_t queries, const float* kt, int64_t ld,
                          int64_t dims, int64_t count, float* scores, int64_t ss);
  void (*dot_columns_bf16)(const float* q, int64_t qs, int64_t queries, const uint16_t* kt,
                           int64_t ld, int64_t dims, int64_t count, float* scores, int64_t ss);
  // acc[g * as + d] = fma(p[g * ps + j], v_j[d], acc[g * as + d]) for j = 0..count-1 in order,
  // d < dims, g < queries, where value row v_j starts `ld` elements after v_{j-1} (the rows of
  // one KV block): attention's weighted sum, continued block after block.
  void (*weighted_rows_f32)(const float* p, int64_t ps, int64_t queries, const float* v, int64_t ld,
                            int64_t count, int64_t dims, float* acc, int64_t as);
  void (*weighted_rows_bf16)(const float* p, int64_t ps, int64_t queries, const uint16_t* v,
                             int64_t ld, int64_t count, int64_t dims, float* acc, int64_t as);
  // x[i] = x[i] * scale for i < n; returns the largest (x > m ? x : m from m = -inf: NaNs are
  // skipped; which zero a zero maximum is, +0 or -0, is unspecified).
  float (*scale_max)(float* x, int64_t n, float scale);
  // x[i] = Exp(x[i] - sub) for i < n; returns their sum in SumSquares' order (16 partials, then
  // the same tree), the softmax denominator.
  float (*exp_sum)(float* x, int64_t n, float sub);
  // RoundActivationsBf16, vectorised (the same bits).
  void (*round_bf16)(const float* x, int64_t k, uint16_t* out);
  float (*sum_squares)(const float* x, int64_t n);
  // out[i] = (g[i] / (1 + Exp(-g[i]))) * u[i].
  void (*silu_mul)(const float* g, const float* u, float* out, int64_t n);
};

const CpuKernels& CpuKernelsFor(CpuIsa isa);

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_CPU_CPU_KERNELS_H_
