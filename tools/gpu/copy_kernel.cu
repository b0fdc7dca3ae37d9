#include <cuda_runtime.h>

#include <cstdint>

#include "tools/gpu/copy_kernel.h"

namespace ferry::gpu_check {
namespace {

__global__ void CopyKernel(const uint4* in, uint4* out, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = in[i];
  }
}

__global__ void FillKernel(uint16_t* out, size_t count, float scale, unsigned seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = static_cast<float>(h & 0xffff) / 65535.0f - 0.5f;  // [-0.5, 0.5]
    const float v = u * 2.0f * scale;
    const uint32_t bits = __float_as_uint(v);
    out[i] = static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
  }
}

}  // namespace

int LaunchCopy(const void* in, void* out, size_t bytes, CUstream_st* stream) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  CopyKernel<<<sms * 8, 512, 0, stream>>>(static_cast<const uint4*>(in), static_cast<uint4*>(out),
                                          bytes / 16);
  return static_cast<int>(cudaGetLastError());
}

int LaunchFillBf16(void* out, size_t count, float scale, unsigned seed, CUstream_st* stream) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  FillKernel<<<sms * 8, 512, 0, stream>>>(static_cast<uint16_t*>(out), count, scale, seed);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ferry::gpu_check
