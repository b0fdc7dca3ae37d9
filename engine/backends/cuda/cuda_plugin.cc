// libferry_cuda.so's one export (cuda_plugin.h).

#include "engine/backends/cuda/cuda_plugin.h"

#include <cstdio>
#include <memory>

#include "engine/backends/cuda/cuda_backend.h"

extern "C" __attribute__((visibility("default"))) void* FerryCudaBackendCreate(
    const FerryCudaBackendOptions* options, char* error, size_t error_size) {
  if (options == nullptr || options->abi != FERRY_CUDA_PLUGIN_ABI) {
    std::snprintf(error, error_size, "libferry_cuda.so: plugin ABI %d, the caller asked for %d",
                  FERRY_CUDA_PLUGIN_ABI, options == nullptr ? -1 : options->abi);
    return nullptr;
  }
  ferry::CudaBackendOptions o;
  o.device = options->device;
  o.memory_bytes = options->memory_bytes;
  o.deterministic = options->deterministic != 0;
  o.graphs = options->graphs != 0;
  if (options->max_graph_rows > 0) o.max_graph_rows = options->max_graph_rows;
  absl::StatusOr<std::unique_ptr<ferry::CudaBackend>> backend = ferry::CudaBackend::Create(o);
  if (!backend.ok()) {
    std::snprintf(error, error_size, "%s", backend.status().ToString().c_str());
    return nullptr;
  }
  ferry::Backend* base = backend->release();
  return base;
}
