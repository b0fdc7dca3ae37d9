// Matrix products on weights kept in GGML's 32-element block formats (Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1: what a GGUF file holds), computed on the blocks rather than on a bf16 copy, so a decode
// step reads the file's bytes, not 2-3x more.
//
// The arithmetic (one definition for every row count, thread count and instruction set, so
// decode and prefill rows agree bit for bit, as cpu_kernels.h requires of every product):
//
//   Activations are quantized per row in blocks of 32, as llama.cpp's x86 code quantizes them
//   (its Q8_0 / Q8_1 activation blocks): amax = the largest |x_i| of the block; d = amax / 127;
//   id = amax == 0 ? 0 : 127 / amax; q_i = x_i * id rounded to the nearest integer, ties to even
//   (then in [-127, 127]); sum = the integer sum of q_i; dx = d rounded to fp16 (nearest even,
//   float_math.h's FloatToHalf) and widened back; sx = d * float(sum) rounded to fp16 likewise.
//   Every step is one fp32 operation. Keeping llama.cpp's fp16 block scales makes Ferry's products
//   on a GGUF file agree with llama.cpp's to fp32 rounding, not merely to the activations'
//   quantization error.
//
//   A weight block holds a scale dw (fp16, widened exactly), for Q4_1 and Q5_1 a minimum mw
//   (fp16), and 32 integers u: Q8_0 signed 8-bit, Q4 4-bit and Q5 5-bit unsigned. Its values are
//   dw * (u - z) with z = 0 (Q8_0), 8 (Q4_0), 16 (Q5_0), or dw * u + mw (Q4_1, Q5_1).
//
//   Output element (m, n): acc = +0; for each block b in increasing order:
//     isum = sum over the block's 32 k of q[m][k] * (u[n][k] - z)     (exact, in integers)
//     acc = fma(dw * dx, float(isum), acc)                             (dw * dx rounded first)
//     and for Q4_1 and Q5_1 then acc = fma(mw, sx, acc).
//   The integer sum is exact whatever the grouping (|isum| < 2^20, so float(isum) is exact too),
//   so vector variants group its terms as their dot-product instructions do (AVX2 pairs with
//   VPMADDUBSW, AVX512-VNNI quads with VPDPBUSD) and still reproduce the scalar definition.
//
// Compared with the dequantized weights and fp32 activations, the only error beyond fp32
// rounding is the activations' quantization: |x_i - dx * q_i| <= d / 2 + 127 * |d - dx|, with
// |d - dx| <= 2^-11 d (fp16's rounding).
//
// Packed layout: panels of kPanel (16) output rows, as the bf16 path; panel p holds its blocks
// b = 0..K/32-1 one after the other, QuantPanelBlockBytes bytes each:
//   dw[16] fp16 | mw[16] fp16 (Q4_1, Q5_1) | qh[64] (Q5) | quants
//   Q8_0 quants: 8 groups of 64 bytes; byte c*4 + j of group g is u[c][4g + j].
//   Q4/Q5 quants: 4 groups of 64 bytes; byte c*4 + j of group g holds u[c][4g + j] & 15 in its
//   low nibble and u[c][16 + 4g + j] & 15 in its high nibble.
//   Q5 qh: byte c*4 + j holds bit 4 of u[c][4v + j] as bit v and of u[c][16 + 4v + j] as bit
//   4 + v (v < 4).
// So one 32-bit lane is one output row and one 64-byte load feeds 16 rows' dot products.
//
// Threading: every function here is reentrant; the caller splits work over panels and rows.

#ifndef FERRY_ENGINE_BACKENDS_CPU_CPU_QUANT_H_
#define FERRY_ENGINE_BACKENDS_CPU_CPU_QUANT_H_

#include <cstddef>
#include <cstdint>

#include "engine/backends/backend.h"
#include "engine/backends/cpu/cpu_kernels.h"

namespace ferry {

constexpr int64_t kQuantBlock = 32;

// Bytes of one block in GGML's layout (Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24).
int64_t GgmlQuantBlockBytes(WeightQuant quant);
// Bytes of one panel's block (16 rows x 32 k) in the packed layout.
int64_t QuantPanelBlockBytes(WeightQuant quant);
// Bytes of the packed form of an n x k matrix (k a multiple of 32).
int64_t PackedQuantBytes(WeightQuant quant, int64_t n, int64_t k);
// Packs `count` (<= 16) rows of GGML blocks (k / 32 blocks each, one row after the other) into
// one panel; rows beyond `count` are zero.
void PackQuantPanel(WeightQuant quant, const uint8_t* rows, int64_t count, int64_t k,
                    uint8_t* panel);
// Row `row` of a packed matrix as fp32: dw * (u - z) or (dw * u) + mw with one rounding per
// operation, bit-identical to GGML's dequantization of the same blocks.
void DequantizePackedRow(WeightQuant quant, const uint8_t* packed, int64_t row, int64_t k,
                         float* out);

// Activation rows quantized as above: row m's k quants at q + m * k, its k / 32 block values
// at d, s and sum + m * (k / 32).
struct QuantizedRows {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const float* s = nullptr;
  const int32_t* sum = nullptr;
  int64_t k = 0;

  // The rows from row `first` on.
  QuantizedRows From(int64_t first) const {
    const int64_t blocks = k / 32;
    return {q + first * k, d + first * blocks, s + first * blocks, sum + first * blocks, k};
  }
};
// Quantizes one row of k (a multiple of 32) activations.
void QuantizeActivationRow(const float* x, int64_t k, int8_t* q, float* d, float* s, int32_t* sum);

// The instruction-set variants of the quantized product (all bit-identical to kScalar).
enum class QuantIsa { kScalar, kAvx2, kAvx512Vnni };
const char* QuantIsaName(QuantIsa isa);
bool QuantIsaSupported(QuantIsa isa);
// The variant a backend of `isa` uses: AVX512-VNNI for the AVX-512 variants where the CPU has
// it, else AVX2 (with F16C) for anything from AVX2 up, else scalar.
QuantIsa QuantIsaFor(CpuIsa isa);

// out[m][c] = the product above for rows m < rows of x, panels p in [panel_begin, panel_end)
// and columns 16p + c < n; out rows `out_stride` floats apart, out pointing at column 0.
using QuantGemmFn = void (*)(WeightQuant quant, const QuantizedRows& x, int64_t rows,
                             const uint8_t* packed, int64_t panel_begin, int64_t panel_end,
                             int64_t n, float* out, int64_t out_stride);
QuantGemmFn QuantGemmFor(QuantIsa isa);

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_CPU_CPU_QUANT_H_
