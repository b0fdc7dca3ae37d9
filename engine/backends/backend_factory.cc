#include "engine/backends/backend_factory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/backends/cuda/cuda_plugin.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

constexpr char kPluginName[] = "libferry_cuda.so";

std::string ExecutablePath() {
  std::vector<char> buffer(4096);
  const ssize_t n = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  return n > 0 ? std::string(buffer.data(), n) : "";
}

std::vector<std::string> PluginCandidates(const BackendOptions& options) {
  if (!options.cuda_plugin.empty()) return {options.cuda_plugin};
  if (const char* env = std::getenv("FERRY_CUDA_PLUGIN"); env != nullptr && *env != '\0') {
    return {env};
  }
  std::vector<std::string> out;
  const std::string exe = ExecutablePath();
  const std::string dir = exe.substr(0, exe.rfind('/'));
  out.push_back(absl::StrCat(dir, "/", kPluginName));
  out.push_back(absl::StrCat(exe, ".runfiles/ferry/engine/backends/cuda/", kPluginName));
  if (const char* runfiles = std::getenv("RUNFILES_DIR"); runfiles != nullptr) {
    out.push_back(absl::StrCat(runfiles, "/ferry/engine/backends/cuda/", kPluginName));
  }
  return out;
}

// The plugin's create function, loaded once (never unloaded: the backends it makes run its code;
// later calls get the first plugin found).
absl::StatusOr<FerryCudaBackendCreateFn> LoadPlugin(const BackendOptions& options) {
  static absl::Mutex mu(absl::kConstInit);
  static FerryCudaBackendCreateFn loaded ABSL_GUARDED_BY(mu) = nullptr;
  absl::MutexLock lock(&mu);
  if (loaded != nullptr) return loaded;
  std::vector<std::string> tried;
  for (const std::string& path : PluginCandidates(options)) {
    if (access(path.c_str(), R_OK) != 0) {
      tried.push_back(absl::StrCat(path, " (absent)"));
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      tried.push_back(absl::StrCat(path, " (", dlerror(), ")"));
      continue;
    }
    void* symbol = dlsym(handle, FERRY_CUDA_PLUGIN_SYMBOL);
    if (symbol == nullptr) {
      tried.push_back(absl::StrCat(path, " (no ", FERRY_CUDA_PLUGIN_SYMBOL, ")"));
      dlclose(handle);
      continue;
    }
    loaded = reinterpret_cast<FerryCudaBackendCreateFn>(symbol);
    return loaded;
  }
  return absl::NotFoundError(absl::StrCat(
      "--backend=cuda: no usable ", kPluginName,
      " (this build may lack the CUDA toolkit; set FERRY_CUDA_PLUGIN to its path); tried ",
      absl::StrJoin(tried, ", ")));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendOptions& options) {
  if (options.kind == "cpu") {
    CpuBackendOptions cpu;
    cpu.threads = options.threads;
    ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> backend, CpuBackend::Create(cpu));
    return std::unique_ptr<Backend>(std::move(backend));
  }
  if (options.kind != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend must be cpu or cuda, not '", options.kind, "'"));
  }
  ASSIGN_OR_RETURN(FerryCudaBackendCreateFn create, LoadPlugin(options));
  FerryCudaBackendOptions o{};
  o.abi = FERRY_CUDA_PLUGIN_ABI;
  o.device = options.cuda_device;
  o.memory_bytes = options.gpu_memory_bytes;
  o.deterministic = options.deterministic ? 1 : 0;
  o.graphs = options.cuda_graphs ? 1 : 0;
  o.max_graph_rows = options.cuda_graph_rows;
  char error[1024] = {};
  void* made = create(&o, error, sizeof(error));
  if (made == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("--backend=cuda: ", error));
  }
  return std::unique_ptr<Backend>(static_cast<Backend*>(made));
}

}  // namespace ferry
