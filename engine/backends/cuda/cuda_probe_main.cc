// ferry-cuda-probe: lists CUDA devices and runs the self-check on each. Exit status: 0 when every
// device passed, or when there is no device at all (reported, not an error: most machines that
// build Ferry have no GPU); 1 when a device exists and its self-check failed.

#include <cstdio>
#include <string>
#include <vector>

#include "engine/backends/cuda/device_probe.h"

int main() {
  std::vector<ferry::cuda::CudaDeviceInfo> devices;
  std::string error;
  if (!ferry::cuda::ListCudaDevices(&devices, &error)) {
    std::printf("cuda: no usable device (%s)\n", error.c_str());
    return 0;
  }
  int failures = 0;
  for (const auto& d : devices) {
    std::printf("cuda: device %d: %s, sm_%d%d, %zu MiB, %d SMs\n", d.index, d.name.c_str(),
                d.compute_major, d.compute_minor, d.total_memory_bytes >> 20, d.multiprocessors);
    std::string report, check_error;
    if (ferry::cuda::RunCudaSelfCheck(d.index, &report, &check_error)) {
      std::printf("cuda: device %d self-check passed: %s\n", d.index, report.c_str());
    } else {
      std::printf("cuda: device %d self-check FAILED: %s\n", d.index, check_error.c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}
