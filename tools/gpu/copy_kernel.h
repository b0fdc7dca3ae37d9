// The GPU check's yardstick: a device-to-device copy kernel (16-byte loads and stores, a grid
// that fills the GPU), whose bandwidth is what "the bytes-read limit" of tools/gpu/check.sh's
// ratios means on the GPU that runs them. Plain C++ header; nvcc builds copy_kernel.cu.

#ifndef FERRY_TOOLS_GPU_COPY_KERNEL_H_
#define FERRY_TOOLS_GPU_COPY_KERNEL_H_

#include <cstddef>

struct CUstream_st;

namespace ferry::gpu_check {

// Copies `bytes` (a multiple of 16, both pointers 16-byte aligned) and returns the launch error
// (0: none). Asynchronous on `stream`.
int LaunchCopy(const void* in, void* out, size_t bytes, CUstream_st* stream);

// Fills `count` bf16 values at `out` with a deterministic pseudo-random pattern of magnitude
// about `scale` (speed runs need device weights without uploading gigabytes).
int LaunchFillBf16(void* out, size_t count, float scale, unsigned seed, CUstream_st* stream);

}  // namespace ferry::gpu_check

#endif  // FERRY_TOOLS_GPU_COPY_KERNEL_H_
