#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/backends/cuda/device_probe.h"

namespace ferry::cuda {
namespace {

__global__ void ScaleAddKernel(const float* x, const float* y, float a, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + y[i];
}

std::string CudaError(const char* what, cudaError_t err) {
  return std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

// Frees device buffers on every exit path.
struct DeviceBuffers {
  std::vector<void*> pointers;
  ~DeviceBuffers() {
    for (void* p : pointers) cudaFree(p);
  }
  bool Alloc(float** out, size_t count, std::string* error) {
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, count * sizeof(float));
    if (err != cudaSuccess) {
      *error = CudaError("cudaMalloc", err);
      return false;
    }
    pointers.push_back(p);
    *out = static_cast<float*>(p);
    return true;
  }
};

}  // namespace

bool ListCudaDevices(std::vector<CudaDeviceInfo>* devices, std::string* error) {
  devices->clear();
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *error = CudaError("cudaGetDeviceCount", err);
    return false;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    const cudaError_t prop_err = cudaGetDeviceProperties(&prop, i);
    if (prop_err != cudaSuccess) {
      *error = CudaError("cudaGetDeviceProperties", prop_err);
      return false;
    }
    CudaDeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.total_memory_bytes = prop.totalGlobalMem;
    info.multiprocessors = prop.multiProcessorCount;
    devices->push_back(info);
  }
  if (count == 0) {
    *error = "no CUDA device";
    return false;
  }
  return true;
}

bool RunCudaSelfCheck(int device, std::string* report, std::string* error) {
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    *error = CudaError("cudaSetDevice", err);
    return false;
  }
  DeviceBuffers buffers;

  // 1. A kernel: out = 2x + y over 1M elements; small integers, so the result is exact.
  constexpr int kN = 1 << 20;
  std::vector<float> x(kN), y(kN), out(kN);
  for (int i = 0; i < kN; ++i) {
    x[i] = static_cast<float>(i % 1000);
    y[i] = static_cast<float>(i % 7);
  }
  float *dx, *dy, *dout;
  if (!buffers.Alloc(&dx, kN, error) || !buffers.Alloc(&dy, kN, error) ||
      !buffers.Alloc(&dout, kN, error)) {
    return false;
  }
  cudaMemcpy(dx, x.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
  ScaleAddKernel<<<(kN + 255) / 256, 256>>>(dx, dy, 2.0f, dout, kN);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    *error = CudaError("ScaleAddKernel", err);
    return false;
  }
  cudaMemcpy(out.data(), dout, kN * sizeof(float), cudaMemcpyDeviceToHost);
  for (int i = 0; i < kN; ++i) {
    if (out[i] != 2.0f * x[i] + y[i]) {
      *error = "ScaleAddKernel: wrong result at " + std::to_string(i);
      return false;
    }
  }
  *report += "kernel(sm_90) ok; ";

  // 2. cuBLAS SGEMM, C = A * B (column-major), 64x64, against a double-precision CPU GEMM.
  constexpr int kM = 64;
  std::vector<float> a(kM * kM), b(kM * kM), c(kM * kM);
  for (int i = 0; i < kM * kM; ++i) {
    a[i] = static_cast<float>((i * 37) % 17) / 17.0f - 0.5f;
    b[i] = static_cast<float>((i * 11) % 13) / 13.0f - 0.5f;
  }
  float *da, *db, *dc;
  if (!buffers.Alloc(&da, kM * kM, error) || !buffers.Alloc(&db, kM * kM, error) ||
      !buffers.Alloc(&dc, kM * kM, error)) {
    return false;
  }
  cudaMemcpy(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    *error = "cublasCreate failed";
    return false;
  }
  // Full fp32 arithmetic (no TF32), so the comparison below is meaningful.
  cublasSetMathMode(handle, CUBLAS_PEDANTIC_MATH);
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t gemm = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, kM, kM, kM, &alpha, da,
                                          kM, db, kM, &beta, dc, kM);
  cublasDestroy(handle);
  if (gemm != CUBLAS_STATUS_SUCCESS) {
    *error = "cublasSgemm failed with status " + std::to_string(static_cast<int>(gemm));
    return false;
  }
  cudaMemcpy(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost);
  double max_err = 0, max_ref = 0;
  for (int col = 0; col < kM; ++col) {
    for (int row = 0; row < kM; ++row) {
      double ref = 0;
      for (int k = 0; k < kM; ++k) ref += double{a[k * kM + row]} * b[col * kM + k];
      max_err = std::fmax(max_err, std::fabs(ref - c[col * kM + row]));
      max_ref = std::fmax(max_ref, std::fabs(ref));
    }
  }
  if (max_err > 1e-5 * max_ref) {
    *error = "cublasSgemm: relative error " + std::to_string(max_err / max_ref);
    return false;
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "cublas sgemm ok (max rel err %.2e)", max_err / max_ref);
  *report += buf;
  return true;
}

}  // namespace ferry::cuda
