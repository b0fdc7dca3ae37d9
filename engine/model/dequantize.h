// Conversion of GGUF tensor data to the engine's weight types: fp32, or bf16 rounded to nearest
// even. Quantized GGUF formats are dequantized at load when the weights are f32 or bf16 (with
// --weights native the block formats below are kept and computed on: cpu_quant.h), with the
// block layouts of the GGML format:
//
//   F32, F16, BF16   one value per element
//   Q8_0   blocks of 32: f16 scale d, 32 x int8 q            x = d * q
//   Q4_0   blocks of 32: f16 d, 16 bytes of nibbles          x = d * (q - 8)
//   Q4_1   blocks of 32: f16 d, f16 m, 16 bytes of nibbles   x = d * q + m
//   Q5_0   blocks of 32: f16 d, 32 high bits, 16 bytes       x = d * (q - 16)
//   Q5_1   blocks of 32: f16 d, f16 m, 32 high bits, 16 b    x = d * q + m
//   (low nibbles of byte j are elements j < 16, high nibbles elements j + 16; a 5-bit q adds bit
//   i of the little-endian 32-bit high word as bit 4 of element i)
//   Q4_K   blocks of 256: f16 d, f16 dmin, 12 bytes of 6-bit scales sc_j and minimums m_j of the
//          eight 32-element sub-blocks, 128 bytes of nibbles   x = (d * sc_j) * q - (dmin * m_j)
//   Q5_K   as Q4_K with 32 bytes of high bits before the nibbles (bit j of byte l: bit 4 of
//          element 32j + l)
//   Q6_K   blocks of 256: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales of
//          16-element groups, f16 d                             x = (d * sc_g) * (q - 32)
//
// Each element is computed in fp32 with one rounding per operation (no fused multiply-add), so the
// result is bit-identical to the reference dequantizer of the `gguf` package (NumPy, float32).
// Large tensors are split into block ranges across the shared thread pool; the result does not
// depend on the split.

#ifndef FERRY_ENGINE_MODEL_DEQUANTIZE_H_
#define FERRY_ENGINE_MODEL_DEQUANTIZE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/backends/backend.h"   // WeightQuant
#include "engine/common/float_math.h"  // FloatToBf16, Bf16ToFloat, HalfToFloat

namespace ferry {

// ggml_type values of the formats above.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

absl::string_view GgmlTypeName(uint32_t type);

// The block format a backend computes on for a GGML type (kNone for F32, F16, BF16 and formats
// it has no kernels for), and back.
WeightQuant WeightQuantOfGgmlType(uint32_t type);
uint32_t GgmlTypeOfWeightQuant(WeightQuant quant);

// Bytes of `elements` values of `type`; 0 when the type is unsupported or `elements` is not a
// whole number of blocks.
size_t GgmlDataSize(uint32_t type, size_t elements);

// Whether `size` bytes of `type` hold exactly `elements` values (a whole number of blocks) of a
// supported type; the error names the problem.
absl::Status CheckDequantize(uint32_t type, size_t size, size_t elements);

// Dequantizes `elements` values (a whole number of blocks) from `data` (`size` bytes) into `out`.
// Unsupported types and size mismatches are errors naming them.
absl::Status DequantizeToF32(uint32_t type, const uint8_t* data, size_t size, size_t elements,
                             float* out);
absl::Status DequantizeToBf16(uint32_t type, const uint8_t* data, size_t size, size_t elements,
                              uint16_t* out);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_DEQUANTIZE_H_
