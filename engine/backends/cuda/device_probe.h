// CUDA device discovery and a self-check of the toolchain and libraries Ferry's CUDA backend uses:
// a kernel built by nvcc for sm_90 and a cuBLAS GEMM, both compared with a CPU computation.
//
// The CUDA backend proper (cuda_backend.h) is beside this file; the probe is what
// `ferry-cuda-probe` runs on a machine to say whether it can serve on the GPU.
//
// Plain C++ types only, so nvcc never sees absl or gRPC headers.

#ifndef FERRY_ENGINE_BACKENDS_CUDA_DEVICE_PROBE_H_
#define FERRY_ENGINE_BACKENDS_CUDA_DEVICE_PROBE_H_

#include <cstddef>
#include <string>
#include <vector>

namespace ferry::cuda {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_memory_bytes = 0;
  int multiprocessors = 0;
};

// Lists the visible devices. Returns false with `error` set when the runtime or driver cannot
// be used (no driver, no device): a normal state on machines without a GPU.
bool ListCudaDevices(std::vector<CudaDeviceInfo>* devices, std::string* error);

// Runs the self-check on `device`: a vector kernel (exact result expected) and a 64x64 SGEMM
// through cuBLAS (relative error <= 1e-5 against the CPU). Returns false with `error` set on any
// failure; `report` describes what ran.
bool RunCudaSelfCheck(int device, std::string* report, std::string* error);

}  // namespace ferry::cuda

#endif  // FERRY_ENGINE_BACKENDS_CUDA_DEVICE_PROBE_H_
