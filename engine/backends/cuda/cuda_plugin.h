// The CUDA backend as a plugin: libferry_cuda.so exports one C function that makes a CudaBackend.
// Binaries that may run on a GPU (ferry-worker) load it with dlopen when asked for
// --backend=cuda (engine/backends/backend_factory.h), so they link no CUDA library themselves and
// run unchanged where there is no toolkit, no driver and no cuBLAS (a CPU-only image).
//
// The function returns a ferry::Backend* (a CudaBackend) as void*, owned by the caller, or null
// with a message in `error`. Its code lives in the plugin, which stays loaded for the process's
// life. Plain C: the ABI the two sides share.

#ifndef FERRY_ENGINE_BACKENDS_CUDA_CUDA_PLUGIN_H_
#define FERRY_ENGINE_BACKENDS_CUDA_CUDA_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_CUDA_PLUGIN_SYMBOL "FerryCudaBackendCreate"
#define FERRY_CUDA_PLUGIN_ABI 3

struct FerryCudaBackendOptions {
  int32_t abi;  // FERRY_CUDA_PLUGIN_ABI
  int32_t device;
  uint64_t memory_bytes;   // 0: 90% of the device's free memory
  int32_t deterministic;   // 1: batch-invariant products (CudaBackendOptions::deterministic)
  int32_t graphs;          // 1: decode steps as CUDA graphs (CudaBackendOptions::graphs)
  int32_t max_graph_rows;  // their most rows (0: CudaBackendOptions' default)
};

typedef void* (*FerryCudaBackendCreateFn)(const struct FerryCudaBackendOptions* options,
                                          char* error, size_t error_size);

#ifdef __cplusplus
}
#endif

#endif  // FERRY_ENGINE_BACKENDS_CUDA_CUDA_PLUGIN_H_
