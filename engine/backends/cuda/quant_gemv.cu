// The product on GGML blocks (Q8_0, Q4_K): out = x * w^T with ggml_blocks.h's arithmetic, the
// CPU backend's bit for bit (cuda_kernels.h's LaunchQuantMatMul).
//
// Pass 1 quantizes the activations, one thread per 32-value block (QuantizeActivationBlock).
// Pass 2: a CTA of kGemvWarps warps covers kGemvWarps output rows n (one warp each) and up to
// kGemvRows activation rows m. A warp walks its weight row 32 blocks at a time: lane i computes
// block (chunk + i)'s terms for every m (the integer dot product and the scales), puts them in
// shared memory, and lanes 0..kGemvRows-1 each fold one m's terms in increasing block order. The
// weights are read once per kGemvRows activation rows; each output's fold is the sequential one
// of the definition, so the result does not depend on M, the grid, or which rows share a CTA.

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backends/cuda/cuda_kernels.h"
#include "engine/backends/cuda/device_access.cuh"
#include "engine/backends/cuda/ggml_blocks.h"
#include "engine/backends/cuda/launch_shapes.h"

namespace ferry::cuda {
namespace {

struct ScratchLayout {
  int8_t* q;                 // [m][k]
  ActivationScales* scales;  // [m][k / 32]
};

ScratchLayout Carve(void* scratch, int64_t m, int64_t k) {
  ScratchLayout s;
  s.q = static_cast<int8_t*>(scratch);
  const size_t q_bytes = (static_cast<size_t>(m * k) + 255) / 256 * 256;
  s.scales = reinterpret_cast<ActivationScales*>(static_cast<char*>(scratch) + q_bytes);
  return s;
}

__global__ void QuantizeKernel(Matrix x, ScratchLayout s) {
  const int64_t blocks = x.cols / kActivationBlock;
  const int64_t total = x.rows * blocks;
  for (int64_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int64_t m = i / blocks, b = i % blocks;
    float values[kActivationBlock];
    for (int j = 0; j < kActivationBlock; ++j) values[j] = At(x, m, b * kActivationBlock + j);
    s.scales[i] = QuantizeActivationBlock(values, s.q + m * x.cols + b * kActivationBlock);
  }
}

template <QuantFormat F>
__global__ void QuantGemvKernel(ScratchLayout s, int64_t m_rows, int64_t k, const uint8_t* w,
                                int64_t n_rows, Matrix out) {
  __shared__ BlockTerms terms[kGemvWarps][kGemvRows][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = blockIdx.x * kGemvWarps + warp;
  const int64_t m0 = blockIdx.y * kGemvRows;
  const int rows = static_cast<int>(m_rows - m0 < kGemvRows ? m_rows - m0 : kGemvRows);
  const int64_t blocks = k / kActivationBlock;
  const int64_t row_bytes =
      F == QuantFormat::kQ8_0 ? blocks * kQ8_0BlockBytes : (k / 256) * kQ4_KBlockBytes;
  const uint8_t* row = w + (n < n_rows ? n : 0) * row_bytes;
  float acc = 0.0f;  // lane i < rows folds output (m0 + i, n)
  for (int64_t chunk = 0; chunk < blocks; chunk += 32) {
    const int64_t b = chunk + lane;
    if (n < n_rows && b < blocks) {
      for (int i = 0; i < rows; ++i) {
        const int64_t m = m0 + i;
        const int8_t* q = s.q + m * k + b * kActivationBlock;
        const ActivationScales& a = s.scales[m * blocks + b];
        terms[warp][i][lane] =
            F == QuantFormat::kQ8_0 ? Q8_0Terms(row, b, q, a) : Q4KTerms(row, b, q, a);
      }
    }
    __syncwarp();
    if (n < n_rows && lane < rows) {
      const int64_t end = blocks - chunk < 32 ? blocks - chunk : 32;
      for (int64_t j = 0; j < end; ++j) {
        acc = FoldBlock(terms[warp][lane][j], F == QuantFormat::kQ4_K, acc);
      }
    }
    __syncwarp();
  }
  if (n < n_rows && lane < rows) Put(out, m0 + lane, n, acc);
}

}  // namespace

size_t QuantScratchBytes(int64_t m, int64_t k) {
  const size_t q_bytes = (static_cast<size_t>(m * k) + 255) / 256 * 256;
  return q_bytes + static_cast<size_t>(m) * (k / kActivationBlock) * sizeof(ActivationScales);
}

int LaunchQuantMatMul(const Matrix& x, const uint8_t* w, QuantFormat format, int64_t n,
                      void* scratch, const Matrix& out, Stream stream) {
  if (x.rows == 0 || n == 0) return 0;
  const ScratchLayout s = Carve(scratch, x.rows, x.cols);
  QuantizeKernel<<<ElementwiseBlocks(x.rows * (x.cols / kActivationBlock)), kElementThreads, 0,
                   stream>>>(x, s);
  int err = LaunchError();
  if (err != 0) return err;
  const GemvGrid g = QuantGemvGrid(x.rows, n);
  const dim3 grid(static_cast<unsigned>(g.x), static_cast<unsigned>(g.y));
  if (format == QuantFormat::kQ8_0) {
    QuantGemvKernel<QuantFormat::kQ8_0>
        <<<grid, kGemvWarps * 32, 0, stream>>>(s, x.rows, x.cols, w, n, out);
  } else {
    QuantGemvKernel<QuantFormat::kQ4_K>
        <<<grid, kGemvWarps * 32, 0, stream>>>(s, x.rows, x.cols, w, n, out);
  }
  return LaunchError();
}

}  // namespace ferry::cuda
