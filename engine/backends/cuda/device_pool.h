// DevicePool: the CUDA backend's device memory, sub-allocated from slabs. cudaMalloc and cudaFree
// are slow and cudaFree synchronizes the device, so the backend takes memory from the runtime in
// large slabs and hands out pieces of them: an Allocate or Free costs a map lookup, and the pool
// never holds more than its limit (the worker's --gpu_memory budget), so a full device is an
// error at Allocate, never an out-of-memory in a kernel.
//
// Pieces are aligned to kDeviceAlignment (256 bytes: what cuBLAS and vector loads want). A
// request larger than a slab gets a slab of its own. Free merges a piece with its free
// neighbours; Trim gives wholly free slabs back.
//
// Ownership: the pool owns its slabs and gives them back (Source::release) on destruction; the
// caller frees every piece before that. Thread-safe (one mutex). Plain C++: the slab source is
// injected (cudaMalloc in the backend, malloc in the tests).

#ifndef FERRY_ENGINE_BACKENDS_CUDA_DEVICE_POOL_H_
#define FERRY_ENGINE_BACKENDS_CUDA_DEVICE_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace ferry::cuda {

constexpr size_t kDeviceAlignment = 256;

class DevicePool {
 public:
  struct Source {
    // Returns `bytes` of memory (aligned to at least kDeviceAlignment) or nullptr.
    std::function<void*(size_t bytes)> reserve;
    std::function<void(void* data, size_t bytes)> release;
  };
  struct Stats {
    size_t in_use_bytes = 0;  // handed out (after alignment)
    size_t peak_in_use_bytes = 0;
    size_t reserved_bytes = 0;  // held in slabs
    size_t slabs = 0;
    size_t pieces = 0;
  };

  // `slab_bytes`: the size of an ordinary slab; `limit_bytes`: the most the pool may reserve.
  DevicePool(Source source, size_t slab_bytes, size_t limit_bytes);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // A piece of at least `bytes` (0 is taken as 1), or nullptr when the limit or the source says
  // no.
  void* Allocate(size_t bytes);
  // Returns a piece from Allocate; nullptr is ignored. A pointer the pool did not hand out is a
  // programming error (checked: it aborts with a message).
  void Free(void* data);
  // Gives wholly free slabs back to the source.
  void Trim();
  Stats stats() const;

 private:
  struct Slab {
    uintptr_t base = 0;
    size_t bytes = 0;
    std::map<size_t, size_t> free;  // offset -> length
    size_t used = 0;
  };
  void* AllocateLocked(size_t bytes);

  const Source source_;
  const size_t slab_bytes_;
  const size_t limit_bytes_;
  mutable std::mutex mu_;
  std::vector<Slab> slabs_;                                // guarded by mu_
  std::map<uintptr_t, std::pair<size_t, size_t>> pieces_;  // address -> (slab, length)
  Stats stats_;
};

}  // namespace ferry::cuda

#endif  // FERRY_ENGINE_BACKENDS_CUDA_DEVICE_POOL_H_
