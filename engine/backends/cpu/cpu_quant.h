// Matrix products on weights kept in GGML's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 in
// blocks of 32 values; the K-quants Q4_K, Q5_K, Q6_K in super-blocks of 256: what a GGUF file
// holds), computed on the blocks rather than on a bf16 copy, so a decode step reads the file's
// bytes, not 2-3x more.
//
// The arithmetic (one definition for every row count, thread count and instruction set, so
// decode and prefill rows agree bit for bit, as cpu_kernels.h requires of every product):
//
//   Activations are quantized per row in blocks of 32, as llama.cpp's x86 code quantizes them
//   for the 32-value formats (its Q8_0 / Q8_1 activation blocks): amax = the largest |x_i| of the
//   block; d = amax / 127; id = amax == 0 ? 0 : 127 / amax; q_i = x_i * id rounded to the nearest
//   integer, ties to even (then in [-127, 127]); sum = the integer sum of q_i, sum_lo that of
//   its first 16; dx = d rounded to fp16 (nearest even, float_math.h's FloatToHalf) and widened
//   back; sx = d * float(sum) rounded to fp16 likewise. Every step is one fp32 operation. Keeping
//   llama.cpp's fp16 block scales makes Ferry's products on a GGUF file agree with llama.cpp's to
//   fp32 rounding, not merely to the activations' quantization error. The K-quants take the same
//   32-value activation blocks (llama.cpp quantizes activations per 256 for them, with an fp32
//   scale: a coarser rounding, so Ferry's K-quant products are the closer to the exact ones).
//
//   Weights, per 32 values (a block, or one sub-block j of a K-quant super-block): integers u
//   (Q8_0 signed 8-bit; Q4 4-bit, Q5 5-bit and Q6_K 6-bit unsigned) and fp16 scales widened
//   exactly:
//     Q8_0, Q4_0, Q5_0   dw * (u - z), z = 0, 8, 16
//     Q4_1, Q5_1         dw * u + mw
//     Q4_K, Q5_K         (dw * sc_j) * u - (dmin * m_j), sc_j and m_j 6-bit, dw and dmin the
//                        super-block's
//     Q6_K               (dw * sc) * (u - 32), one int8 sc for each 16 values (sc_lo, sc_hi)
//
//   Output element (m, n): acc = +0; for each 32-value block b in increasing order:
//     Q8_0, Q4_0, Q5_0   isum = sum of q[m][k] * (u[n][k] - z); acc = fma(dw * dx, isum, acc)
//     Q4_1, Q5_1         the same with z = 0, then acc = fma(mw, sx, acc)
//     Q4_K, Q5_K         isum = sc_j * sum of q * u; acc = fma(dw * dx, isum, acc);
//                        acc = fma(-(dmin * m_j), sx, acc)
//     Q6_K               isum = sc_lo * (sum over the first 16 k of q * (u - 32)) + sc_hi * (that
//                        over the last 16); acc = fma(dw * dx, isum, acc)
//   (a product of two values is rounded once before the fma; isum converts to fp32 exactly).
//   The integer sums are exact whatever the grouping (|isum| < 2^24), so vector variants group
//   their terms as their dot-product instructions do (AVX2 pairs with VPMADDUBSW, AVX512-VNNI
//   quads with VPDPBUSD) and still reproduce the scalar definition.
//
// Compared with the dequantized weights and fp32 activations, the only error beyond fp32
// rounding is the activations' quantization: |x_i - dx * q_i| <= d / 2 + 127 * |d - dx|, with
// |d - dx| <= 2^-11 d (fp16's rounding).
//
// Packed layout: panels of kPanel (16) output rows, as the bf16 path. A panel holds its
// super-blocks one after the other (a 32-value format's super-block is one block), each a
// header and then its sub-blocks (1, or 8 for a K-quant) of 32 k:
//   header:    dw[16] fp16 | mw[16] fp16 (Q4_1, Q5_1; dmin for Q4_K, Q5_K)
//   sub-block: scales[32] (K-quants: sc_j[16] | m_j[16] bytes; Q6_K sc_lo[16] | sc_hi[16] int8)
//              | qh (Q5: 64 bytes, Q6_K: 128) | quants (Q8_0: 512 bytes, else 256)
//   Q8_0 quants: 8 groups of 64 bytes; byte c*4 + j of group g is u[c][4g + j].
//   Q4/Q5/Q6 quants: 4 groups of 64 bytes; byte c*4 + j of group g holds u[c][4g + j] & 15 in its
//   low nibble and u[c][16 + 4g + j] & 15 in its high nibble.
//   Q5 qh: byte c*4 + j holds bit 4 of u[c][4v + j] as bit v and of u[c][16 + 4v + j] as bit
//   4 + v (v < 4).
//   Q6_K qh: byte c*4 + j of the first 64 bytes holds bits 4-5 of u[c][4v + j] as bits 2v, 2v+1;
//   of the second 64 those of u[c][16 + 4v + j].
// So one 32-bit lane is one output row and one 64-byte load feeds 16 rows' dot products. The
// packed K-quants take 2.8% (Q4_K), 2.3% (Q5_K) and 0% (Q6_K) more bytes than the file.
//
// Threading: every function here is reentrant; the caller splits work over panels and rows.

#ifndef FERRY_ENGINE_BACKENDS_CPU_CPU_QUANT_H_
#define FERRY_ENGINE_BACKENDS_CPU_CPU_QUANT_H_

#include <cstddef>
#include <cstdint>

#include "engine/backends/backend.h"
#include "engine/backends/cpu/cpu_kernels.h"

namespace ferry {

// Values per activation block (and per weight block or sub-block).
constexpr int64_t kQuantBlock = 32;

// Values per block in GGML's layout: 32, or 256 for the K-quants. A row's length must be a
// multiple of it.
int64_t GgmlQuantBlockElements(WeightQuant quant);
// Bytes of one block in GGML's layout (Q8_0 34, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q4_K 144,
// Q5_K 176, Q6_K 210).
int64_t GgmlQuantBlockBytes(WeightQuant quant);
// Bytes of one packed panel (16 rows) of k columns (a multiple of GgmlQuantBlockElements).
int64_t QuantPanelBytes(WeightQuant quant, int64_t k);
// Bytes of the packed form of an n x k matrix.
int64_t PackedQuantBytes(WeightQuant quant, int64_t n, int64_t k);
// Packs `count` (<= 16) rows of GGML blocks (k / GgmlQuantBlockElements blocks each, one row
// after the other) into one panel; rows beyond `count` are zero.
void PackQuantPanel(WeightQuant quant, const uint8_t* rows, int64_t count, int64_t k,
                    uint8_t* panel);
// Row `row` of a packed matrix as fp32: dw * (u - z) or (dw * u) + mw with one rounding per
// operation, bit-identical to GGML's dequantization of the same blocks.
void DequantizePackedRow(WeightQuant quant, const uint8_t* packed, int64_t row, int64_t k,
                         float* out);

// One activation block's values besides its quants (the definitions above).
struct ActivationBlock {
  float d = 0.0f;  // dx
  float s = 0.0f;  // sx
  int32_t sum = 0;
  int32_t sum_lo = 0;
};

// Activation rows quantized as above: row m's k quants at q + m * k, its k / 32 blocks at
// blocks + m * (k / 32).
struct QuantizedRows {
  const int8_t* q = nullptr;
  const ActivationBlock* blocks = nullptr;
  int64_t k = 0;

  // The rows from row `first` on.
  QuantizedRows From(int64_t first) const {
    return {q + first * k, blocks + first * (k / kQuantBlock), k};
  }
};
// Quantizes one row of k (a multiple of 32) activations.
void QuantizeActivationRow(const float* x, int64_t k, int8_t* q, ActivationBlock* blocks);

// The instruction-set variants of the quantized product (all bit-identical to kScalar).
enum class QuantIsa { kScalar, kAvx2, kAvx512Vnni };
const char* QuantIsaName(QuantIsa isa);
bool QuantIsaSupported(QuantIsa isa);
// The CPU converts fp16 in hardware (F16C), as the block formats' scales need.
bool CpuHasF16c();
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
