// The CUDA backend's row-wise and elementwise kernels: embedding lookup, RmsNorm (with the
// residual add), add, SwiGLU, row gather and scatter-add, bias, dtype conversion, RoPE and the
// KV cache write (cuda_kernels.h). Each output element is computed by one thread in a fixed
// order, and RmsNorm's sum of squares by a fixed tree over kRowThreads partial sums, so results
// do not depend on the batch.

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backends/cuda/cuda_kernels.h"
#include "engine/backends/cuda/device_access.cuh"
#include "engine/backends/cuda/ggml_blocks.h"
#include "engine/backends/cuda/launch_shapes.h"
#include "engine/common/float_math.h"

namespace ferry::cuda {
namespace {

__global__ void EmbedDenseKernel(const void* table, Elem table_elem, int64_t cols,
                                 const int32_t* ids, Matrix out) {
  const int64_t r = blockIdx.x;
  const int64_t row = ids[r];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    Put(out, r, c, LoadElem(table, table_elem, row * cols + c));
  }
}

__global__ void EmbedQuantKernel(const uint8_t* table, QuantFormat format, int64_t cols,
                                 const int32_t* ids, Matrix out) {
  const int64_t r = blockIdx.x;
  const int64_t row = ids[r];
  if (format == QuantFormat::kQ8_0) {
    const uint8_t* base = table + row * (cols / 32) * kQ8_0BlockBytes;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      Put(out, r, c, Q8_0Value(base + (c / 32) * kQ8_0BlockBytes, static_cast<int>(c % 32)));
    }
  } else {
    const uint8_t* base = table + row * (cols / 256) * kQ4_KBlockBytes;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      Put(out, r, c, Q4KValue(base + (c / 256) * kQ4_KBlockBytes, static_cast<int>(c % 256)));
    }
  }
}

// One CTA per (row, group). With delta: x += delta, stored back, then the norm of the sum.
__global__ void RmsNormKernel(Matrix x, Matrix delta, bool has_delta, Matrix weight, float eps,
                              Matrix out) {
  __shared__ float scratch[kRowThreads];
  const int64_t r = blockIdx.x, c0 = blockIdx.y * weight.cols, n = weight.cols;
  float squares = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) {
    float v = At(x, r, c0 + i);
    if (has_delta) {
      v = v + At(delta, r, c0 + i);
      Put(x, r, c0 + i, v);
      v = At(x, r, c0 + i);  // the residual as stored (rounded to its type)
    }
    squares = squares + v * v;
  }
  const float total = CtaSum<kRowThreads>(squares, scratch);
  const float inv = 1.0f / sqrtf(total / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kRowThreads) {
    const float v = At(x, r, c0 + i);
    Put(out, r, c0 + i, (v * inv) * At(weight, 0, i));
  }
}

__global__ void AddKernel(Matrix acc, Matrix x) {
  const int64_t n = acc.rows * acc.cols;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t r = i / acc.cols, c = i % acc.cols;
    Put(acc, r, c, At(acc, r, c) + At(x, r, c));
  }
}

__global__ void SwiGluKernel(Matrix gate, Matrix up, Matrix out) {
  const int64_t n = gate.rows * gate.cols;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t r = i / gate.cols, c = i % gate.cols;
    const float g = At(gate, r, c);
    const float silu = g / (1.0f + Exp(-g));
    Put(out, r, c, silu * At(up, r, c));
  }
}

__global__ void GatherRowsKernel(Matrix x, const int32_t* rows, Matrix out) {
  const int64_t i = blockIdx.x;
  for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) Put(out, i, c, At(x, rows[i], c));
}

__global__ void AddScaledRowsKernel(Matrix x, const int32_t* rows, const float* scales,
                                    Matrix acc) {
  const int64_t i = blockIdx.x;
  const int64_t r = rows[i];
  for (int64_t c = threadIdx.x; c < acc.cols; c += blockDim.x) {
    const float product = scales[i] * At(x, i, c);
    Put(acc, r, c, At(acc, r, c) + product);
  }
}

__global__ void AddBiasKernel(Matrix out, Matrix bias) {
  const int64_t n = out.rows * out.cols;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t r = i / out.cols, c = i % out.cols;
    Put(out, r, c, At(out, r, c) + At(bias, 0, c));
  }
}

__global__ void ConvertKernel(Matrix in, Matrix out) {
  const int64_t n = in.rows * in.cols;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const int64_t r = i / in.cols, c = i % in.cols;
    Put(out, r, c, At(in, r, c));
  }
}

__global__ void ToBf16Kernel(const void* in, Elem in_elem, int64_t count, uint16_t* out) {
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    out[i] = FloatToBf16(LoadElem(in, in_elem, i));
  }
}

// One CTA per row; threads over (head, i < half).
__global__ void RopeKernel(Matrix x, int32_t heads, const int32_t* positions, Matrix table) {
  const int64_t r = blockIdx.x;
  const int32_t head_dim = static_cast<int32_t>(x.cols / heads), half = head_dim / 2;
  const int64_t p = positions[r];
  for (int32_t t = threadIdx.x; t < heads * half; t += blockDim.x) {
    const int32_t h = t / half, i = t % half;
    const int64_t c0 = static_cast<int64_t>(h) * head_dim + i;
    const float x0 = At(x, r, c0), x1 = At(x, r, c0 + half);
    const float cos_v = At(table, p, i), sin_v = At(table, p, half + i);
    Put(x, r, c0, x0 * cos_v - x1 * sin_v);
    Put(x, r, c0 + half, x1 * cos_v + x0 * sin_v);
  }
}

// One CTA per row; threads over kv_heads * head_dim.
__global__ void WriteKvKernel(Matrix k, Matrix v, KvView kv, DeviceStep step) {
  const int64_t r = blockIdx.x;
  const StepOffsets& o = step.offsets;
  if (step.words[o.writes + r] == 0) return;
  const int32_t p = step.words[o.positions + r], s = step.words[o.row_sequence + r];
  const int32_t block =
      step.words[o.tables + step.words[o.table_offsets + s] + p / kv.block_tokens];
  const int32_t slot = p % kv.block_tokens;
  uint8_t* base = static_cast<uint8_t*>(kv.base) + static_cast<size_t>(block) * kv.block_bytes;
  void* keys = base + kv.k_offset;
  void* values = base + kv.v_offset;
  const int32_t width = kv.kv_heads * kv.head_dim;
  for (int32_t c = threadIdx.x; c < width; c += blockDim.x) {
    const int32_t h = c / kv.head_dim, d = c % kv.head_dim;
    const int64_t ki = (static_cast<int64_t>(h) * kv.head_dim + d) * kv.block_tokens + slot;
    const int64_t vi = (static_cast<int64_t>(h) * kv.block_tokens + slot) * kv.head_dim + d;
    StoreElem(keys, kv.elem, ki, At(k, r, c));
    StoreElem(values, kv.elem, vi, At(v, r, c));
  }
}

}  // namespace

int LaunchEmbedDense(const void* table, Elem table_elem, int64_t cols, const int32_t* ids,
                     const Matrix& out, Stream stream) {
  if (out.rows == 0) return 0;
  EmbedDenseKernel<<<out.rows, kRowThreads, 0, stream>>>(table, table_elem, cols, ids, out);
  return LaunchError();
}

int LaunchEmbedQuant(const uint8_t* table, QuantFormat format, int64_t cols, const int32_t* ids,
                     const Matrix& out, Stream stream) {
  if (out.rows == 0) return 0;
  EmbedQuantKernel<<<out.rows, kRowThreads, 0, stream>>>(table, format, cols, ids, out);
  return LaunchError();
}

int LaunchRmsNorm(const Matrix& x, const Matrix* delta, const Matrix& weight, float eps,
                  const Matrix& out, Stream stream) {
  if (x.rows == 0) return 0;
  const dim3 grid(static_cast<unsigned>(x.rows), static_cast<unsigned>(x.cols / weight.cols));
  RmsNormKernel<<<grid, kRowThreads, 0, stream>>>(x, delta != nullptr ? *delta : Matrix(),
                                                  delta != nullptr, weight, eps, out);
  return LaunchError();
}

int LaunchAdd(const Matrix& acc, const Matrix& x, Stream stream) {
  if (acc.rows * acc.cols == 0) return 0;
  AddKernel<<<ElementwiseBlocks(acc.rows * acc.cols), kElementThreads, 0, stream>>>(acc, x);
  return LaunchError();
}

int LaunchSwiGlu(const Matrix& gate, const Matrix& up, const Matrix& out, Stream stream) {
  if (gate.rows * gate.cols == 0) return 0;
  SwiGluKernel<<<ElementwiseBlocks(gate.rows * gate.cols), kElementThreads, 0, stream>>>(gate, up,
                                                                                         out);
  return LaunchError();
}

int LaunchGatherRows(const Matrix& x, const int32_t* rows, const Matrix& out, Stream stream) {
  if (out.rows == 0) return 0;
  GatherRowsKernel<<<out.rows, kRowThreads, 0, stream>>>(x, rows, out);
  return LaunchError();
}

int LaunchAddScaledRows(const Matrix& x, const int32_t* rows, const float* scales,
                        const Matrix& acc, Stream stream) {
  if (x.rows == 0) return 0;
  AddScaledRowsKernel<<<x.rows, kRowThreads, 0, stream>>>(x, rows, scales, acc);
  return LaunchError();
}

int LaunchAddBias(const Matrix& out, const Matrix& bias, Stream stream) {
  if (out.rows * out.cols == 0) return 0;
  AddBiasKernel<<<ElementwiseBlocks(out.rows * out.cols), kElementThreads, 0, stream>>>(out, bias);
  return LaunchError();
}

int LaunchConvert(const Matrix& in, const Matrix& out, Stream stream) {
  if (in.rows * in.cols == 0) return 0;
  ConvertKernel<<<ElementwiseBlocks(in.rows * in.cols), kElementThreads, 0, stream>>>(in, out);
  return LaunchError();
}

int LaunchToBf16(const void* in, Elem in_elem, int64_t count, uint16_t* out, Stream stream) {
  if (count == 0) return 0;
  ToBf16Kernel<<<ElementwiseBlocks(count), kElementThreads, 0, stream>>>(in, in_elem, count, out);
  return LaunchError();
}

int LaunchRope(const Matrix& x, int32_t heads, const int32_t* positions, const Matrix& table,
               Stream stream) {
  if (x.rows == 0) return 0;
  RopeKernel<<<x.rows, kRowThreads, 0, stream>>>(x, heads, positions, table);
  return LaunchError();
}

int LaunchWriteKv(const Matrix& k, const Matrix& v, const KvView& kv, const DeviceStep& step,
                  Stream stream) {
  if (k.rows == 0) return 0;
  WriteKvKernel<<<k.rows, kRowThreads, 0, stream>>>(k, v, kv, step);
  return LaunchError();
}

}  // namespace ferry::cuda
