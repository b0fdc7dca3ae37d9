// Device-side helpers shared by the CUDA backend's kernels: element loads and stores by runtime
// element type (uniform across a warp, so the branch costs nothing), and fixed-shape CTA
// reductions (the same tree whatever the data, so their results are deterministic). nvcc only.

#ifndef FERRY_ENGINE_BACKENDS_CUDA_DEVICE_ACCESS_CUH_
#define FERRY_ENGINE_BACKENDS_CUDA_DEVICE_ACCESS_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backends/cuda/cuda_kernels.h"
#include "engine/common/float_math.h"

namespace ferry::cuda {

__device__ __forceinline__ float LoadElem(const void* base, Elem elem, int64_t i) {
  return elem == Elem::kF32 ? static_cast<const float*>(base)[i]
                            : Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
}

__device__ __forceinline__ void StoreElem(void* base, Elem elem, int64_t i, float v) {
  if (elem == Elem::kF32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = FloatToBf16(v);
  }
}

__device__ __forceinline__ float At(const Matrix& m, int64_t r, int64_t c) {
  return LoadElem(m.data, m.elem, r * m.stride + c);
}

__device__ __forceinline__ void Put(const Matrix& m, int64_t r, int64_t c, float v) {
  StoreElem(m.data, m.elem, r * m.stride + c, v);
}

// The sum of `v` over a CTA of kThreads threads (a power of two), by a fixed tree; every thread
// gets the result. `scratch`: kThreads floats of shared memory.
template <int kThreads>
__device__ __forceinline__ float CtaSum(float v, float* scratch) {
  const int t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
#pragma unroll
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (t < s) scratch[t] = scratch[t] + scratch[t + s];
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();
  return total;
}

template <int kThreads>
__device__ __forceinline__ float CtaMax(float v, float* scratch) {
  const int t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
#pragma unroll
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (t < s) scratch[t] = fmaxf(scratch[t], scratch[t + s]);
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();
  return total;
}

inline int LaunchError() { return static_cast<int>(cudaGetLastError()); }

}  // namespace ferry::cuda

#endif  // FERRY_ENGINE_BACKENDS_CUDA_DEVICE_ACCESS_CUH_
