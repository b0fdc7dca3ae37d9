// The batch-invariant GEMM of --deterministic mode (cuda_kernels.h's LaunchDeterministicGemm):
// out = x * w^T with bf16 x and w, fp32 accumulation, on tensor cores (WMMA m16n16k16).
//
// Why batch-invariant: every output element (m, n) is accumulated by one warp's fragment over
// k in increasing steps of 16, one MMA per step, whatever M is: no split-K, no reduction across
// warps or CTAs, and a tile shape that depends on nothing but the constants below. An MMA computes
// each output element from its own row and column only, so a row's result does not depend on
// which rows share its tile (rows past M are zeros). A K that is not a multiple of 32 is padded
// with zeros, whose products add +0 and change no sum.
//
// Shape: a CTA of 4 warps computes a 64 x 64 tile of the output (2 x 2 warps of 32 x 32, each
// 2 x 2 fragments), staging 64 x 32 tiles of x and w in shared memory per k step.

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "engine/backends/cuda/cuda_kernels.h"
#include "engine/backends/cuda/device_access.cuh"
#include "engine/backends/cuda/launch_shapes.h"

namespace ferry::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = 64;  // output rows and columns per CTA
constexpr int kStep = 32;  // k per shared-memory stage
constexpr int kPad = 8;    // bf16 elements of padding per shared row (bank conflicts)
constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    DeterministicGemmKernel(const uint16_t* x, int64_t x_stride, const uint16_t* w, int64_t m,
                            int64_t n, int64_t k, Matrix out) {
  __shared__ __align__(32) __nv_bfloat16 xs[kTile][kStep + kPad];
  __shared__ __align__(32) __nv_bfloat16 ws[kTile][kStep + kPad];
  __shared__ __align__(32) float cs[kTile][kTile + 4];
  const int warp = threadIdx.x / 32;
  const int wm = warp / 2, wn = warp % 2;  // the warp's 32 x 32 quarter of the tile
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  for (int64_t k0 = 0; k0 < k; k0 += kStep) {
    // Stage the tiles: 64 rows x 32 k of x and of w, zeros outside the matrices.
    for (int e = threadIdx.x; e < kTile * kStep; e += kThreads) {
      const int r = e / kStep, c = e % kStep;
      const int64_t kk = k0 + c;
      const uint16_t xv = (m0 + r < m && kk < k) ? x[(m0 + r) * x_stride + kk] : 0;
      const uint16_t wv = (n0 + r < n && kk < k) ? w[(n0 + r) * k + kk] : 0;
      xs[r][c] = __ushort_as_bfloat16(xv);
      ws[r][c] = __ushort_as_bfloat16(wv);
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kStep; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        wmma::load_matrix_sync(a[i], &xs[wm * 32 + i * 16][kk], kStep + kPad);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // w^T as a column-major K x N: w's rows are its columns.
        wmma::load_matrix_sync(b[j], &ws[wn * 32 + j * 16][kk], kStep + kPad);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(&cs[wm * 32 + i * 16][wn * 32 + j * 16], acc[i][j], kTile + 4,
                              wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
    const int r = e / kTile, c = e % kTile;
    if (m0 + r < m && n0 + c < n) Put(out, m0 + r, n0 + c, cs[r][c]);
  }
}

}  // namespace

int LaunchDeterministicGemm(const Matrix& x, const uint16_t* w, int64_t n, const Matrix& out,
                            Stream stream) {
  if (x.rows == 0 || n == 0) return 0;
  if (x.elem != Elem::kBF16) return static_cast<int>(cudaErrorInvalidValue);
  const dim3 grid(static_cast<unsigned>(CeilDiv(n, kTile)),
                  static_cast<unsigned>(CeilDiv(x.rows, kTile)));
  DeterministicGemmKernel<<<grid, kThreads, 0, stream>>>(static_cast<const uint16_t*>(x.data),
                                                         x.stride, w, x.rows, n, x.cols, out);
  return LaunchError();
}

}  // namespace ferry::cuda
