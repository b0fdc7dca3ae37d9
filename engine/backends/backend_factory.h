// The backend a process computes on, by name: "cpu" (the reference, always there) or "cuda" (one
// NVIDIA GPU, through the plugin libferry_cuda.so, engine/backends/cuda/cuda_plugin.h).
//
// The plugin is looked for at BackendOptions::cuda_plugin, else $FERRY_CUDA_PLUGIN, else beside
// the executable, else in the executable's Bazel runfiles; the first one found stays loaded for
// the process. Errors: InvalidArgument for an unknown kind; NotFound when there is no plugin (a
// build without the CUDA toolkit); FailedPrecondition when it loads but cannot make a backend (no
// usable GPU, or a plugin of another ABI version). Thread-safe.

#ifndef FERRY_ENGINE_BACKENDS_BACKEND_FACTORY_H_
#define FERRY_ENGINE_BACKENDS_BACKEND_FACTORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backends/backend.h"

namespace ferry {

struct BackendOptions {
  std::string kind = "cpu";       // cpu | cuda
  int threads = 0;                // cpu: compute threads (0: one per core)
  int cuda_device = 0;            // cuda: which GPU
  uint64_t gpu_memory_bytes = 0;  // cuda: the most device memory to hold (0: 90% of what is free)
  bool deterministic = false;     // cuda: batch-invariant products (cpu: always deterministic)
  bool cuda_graphs = true;        // cuda: decode steps as CUDA graphs
  int cuda_graph_rows = 0;        // cuda: of at most this many rows (0: the backend's default)
  std::string cuda_plugin;        // cuda: the plugin's path ("": the search above)
};

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options);

}  // namespace ferry

#endif  // FERRY_ENGINE_BACKENDS_BACKEND_FACTORY_H_
