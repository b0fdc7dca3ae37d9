// GGML's Q8_0 and Q4_K weight blocks as the CUDA backend reads them, and the block-by-block
// product of engine/backends/cpu/cpu_quant.h, written once for the host and the GPU
// (FERRY_HOST_DEVICE) so the GPU's quantized products are bit-identical to the CPU backend's and
// the arithmetic is unit-tested on the host.
//
// The GPU keeps a quantized weight in GGML's own layout (rows of blocks, as the file stores
// them): Q8_0 blocks of 32 values (fp16 d, int8 q[32]: 34 bytes); Q4_K super-blocks of 256
// (fp16 d, fp16 dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of nibbles: 144 bytes).
//
// Activations are quantized per 32 values exactly as cpu_quant.h defines (QuantizeActivations
// below), and output element (m, n) is the fold over blocks b in increasing order:
//   Q8_0: acc = fma(dw * dx, isum, acc)
//   Q4_K: acc = fma(dw * dx, sc_j * isum, acc); acc = fma(-(dmin * m_j), sx, acc)
// with isum the exact integer dot product of the block's 32 quants.
//
// Plain C++ (and nvcc); no state. Callers check sizes (k a multiple of the block).

#ifndef FERRY_ENGINE_BACKENDS_CUDA_GGML_BLOCKS_H_
#define FERRY_ENGINE_BACKENDS_CUDA_GGML_BLOCKS_H_

#include <cstdint>

#include "engine/common/float_math.h"
#include "engine/common/host_device.h"

namespace ferry::cuda {

constexpr int kQ8_0BlockBytes = 34;
constexpr int kQ4_KBlockBytes = 144;
constexpr int kActivationBlock = 32;

// One 32-value activation block's scales and sums (cpu_quant.h's ActivationBlock).
struct ActivationScales {
  float d;  // dx: amax / 127 rounded to fp16
  float s;  // sx: d * sum rounded to fp16
  int32_t sum;
};

FERRY_HOST_DEVICE inline uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

// Quantizes x[0..32) into q and returns the block's scales (cpu_quant.cc's
// QuantizeActivationRow for one block).
FERRY_HOST_DEVICE inline ActivationScales QuantizeActivationBlock(const float* x, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < kActivationBlock; ++i) {
    const float a = fabsf(x[i]);
    amax = a > amax ? a : amax;
  }
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int32_t total = 0;
  for (int i = 0; i < kActivationBlock; ++i) {
    float r = RoundHalfEven(x[i] * id);
    r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
    const int32_t v = r == r ? static_cast<int32_t>(r) : 0;  // NaN: 0
    q[i] = static_cast<int8_t>(v);
    total += v;
  }
  ActivationScales out;
  out.d = HalfToFloat(FloatToHalf(d));
  out.sum = total;
  out.s = HalfToFloat(FloatToHalf(d * static_cast<float>(total)));
  return out;
}

// Q4_K's 6-bit scale and minimum of sub-block j (0..7) from its 12 packed bytes (GGML's
// get_scale_min_k4).
FERRY_HOST_DEVICE inline void Q4KScaleMin(const uint8_t* scales, int j, int32_t* sc, int32_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Value i (0..31) of a Q8_0 block, and value e (0..255) of a Q4_K super-block, as fp32 with one
// rounding per operation (GGML's dequantization).
FERRY_HOST_DEVICE inline float Q8_0Value(const uint8_t* block, int i) {
  return HalfToFloat(LoadU16(block)) * static_cast<float>(static_cast<int8_t>(block[2 + i]));
}
FERRY_HOST_DEVICE inline float Q4KValue(const uint8_t* block, int e) {
  const int j = e / 32, l = e % 32;
  int32_t sc, m;
  Q4KScaleMin(block + 4, j, &sc, &m);
  const int32_t u = (block[16 + 32 * (j / 2) + l] >> (j % 2 ? 4 : 0)) & 0x0f;
  const float d = HalfToFloat(LoadU16(block)) * static_cast<float>(sc);
  const float dm = HalfToFloat(LoadU16(block + 2)) * static_cast<float>(m);
  return d * static_cast<float>(u) - dm;
}

// What 32-value block b of a weight row adds to an output: acc = fma(scale, isum, acc), then for
// Q4_K acc = fma(min, sx, acc). Block b is a Q8_0 row's block b, or sub-block b % 8 of
// super-block b / 8 of a Q4_K row; q: the activations' 32 quants of block b. Split from the fold
// so the GPU computes blocks' terms in parallel and folds them in order.
struct BlockTerms {
  float scale;  // dw * dx
  float isum;   // the integer sum (times sc_j for Q4_K), exactly
  float min;    // Q4_K: -(dmin * m_j)
  float sx;     // Q4_K: the activation block's sx
};

FERRY_HOST_DEVICE inline BlockTerms Q8_0Terms(const uint8_t* row, int64_t b, const int8_t* q,
                                              const ActivationScales& a) {
  const uint8_t* block = row + b * kQ8_0BlockBytes;
  int32_t isum = 0;
  for (int i = 0; i < 32; ++i) {
    isum += static_cast<int32_t>(q[i]) * static_cast<int8_t>(block[2 + i]);
  }
  return BlockTerms{HalfToFloat(LoadU16(block)) * a.d, static_cast<float>(isum), 0.0f, 0.0f};
}

FERRY_HOST_DEVICE inline BlockTerms Q4KTerms(const uint8_t* row, int64_t b, const int8_t* q,
                                             const ActivationScales& a) {
  const uint8_t* block = row + (b / 8) * kQ4_KBlockBytes;
  const int j = static_cast<int>(b % 8);
  int32_t sc, m;
  Q4KScaleMin(block + 4, j, &sc, &m);
  const uint8_t* qs = block + 16 + 32 * (j / 2);
  const int shift = j % 2 ? 4 : 0;
  int32_t isum = 0;
  for (int l = 0; l < 32; ++l) isum += static_cast<int32_t>(q[l]) * ((qs[l] >> shift) & 0x0f);
  return BlockTerms{HalfToFloat(LoadU16(block)) * a.d, static_cast<float>(sc * isum),
                    -(HalfToFloat(LoadU16(block + 2)) * static_cast<float>(m)), a.s};
}

// One step of the fold.
FERRY_HOST_DEVICE inline float FoldBlock(const BlockTerms& t, bool has_min, float acc) {
  acc = FusedMultiplyAdd(t.scale, t.isum, acc);
  return has_min ? FusedMultiplyAdd(t.min, t.sx, acc) : acc;
}

}  // namespace ferry::cuda

#endif  // FERRY_ENGINE_BACKENDS_CUDA_GGML_BLOCKS_H_
