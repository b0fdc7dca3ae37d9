// The greedy token on the device: one CTA per row of fp32 logits, each thread the best of its
// strided elements, then a fixed tree over the threads. Ties go to the lowest index and NaN never
// wins, as the host sampler's greedy choice (cuda_kernels.h's LaunchArgMax); a row with nothing
// above -inf gives 0.

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/backends/cuda/cuda_kernels.h"
#include "engine/backends/cuda/device_access.cuh"
#include "engine/backends/cuda/launch_shapes.h"

namespace ferry::cuda {
namespace {

// Whether (v, i) beats (best, best_i): larger, or equal with a lower index; NaN never.
__device__ __forceinline__ bool Beats(float v, int64_t i, float best, int64_t best_i) {
  if (v != v) return false;
  if (best != best) return true;
  return v > best || (v == best && i < best_i);
}

__global__ void ArgMaxKernel(Matrix logits, int32_t* out) {
  __shared__ float values[kRowThreads];
  __shared__ int64_t indices[kRowThreads];
  const int64_t r = blockIdx.x;
  const int t = threadIdx.x;
  float best = NAN;
  int64_t best_i = logits.cols;
  for (int64_t c = t; c < logits.cols; c += kRowThreads) {
    const float v = At(logits, r, c);
    if (Beats(v, c, best, best_i)) {
      best = v;
      best_i = c;
    }
  }
  values[t] = best;
  indices[t] = best_i;
  __syncthreads();
  for (int s = kRowThreads / 2; s > 0; s /= 2) {
    if (t < s && Beats(values[t + s], indices[t + s], values[t], indices[t])) {
      values[t] = values[t + s];
      indices[t] = indices[t + s];
    }
    __syncthreads();
  }
  // Nothing above -inf (every value -inf or NaN): 0, as the host sampler.
  if (t == 0) {
    out[r] =
        indices[0] < logits.cols && values[0] > -INFINITY ? static_cast<int32_t>(indices[0]) : 0;
  }
}

}  // namespace

int LaunchArgMax(const Matrix& logits, int32_t* out, Stream stream) {
  if (logits.rows == 0) return 0;
  ArgMaxKernel<<<logits.rows, kRowThreads, 0, stream>>>(logits, out);
  return LaunchError();
}

}  // namespace ferry::cuda
