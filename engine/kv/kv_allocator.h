// The KV pool's memory seam: a contiguous byte range (MemorySpan) and who supplies it
// (KvAllocator). The KV block pool takes its region from one (kv_block_pool.h
// BackendKvAllocator: from a Backend); the KV transport supplies memory it has registered for
// remote access (services/transfer/kv_transport.h TransportKvAllocator). This header is the only
// part of engine/kv the service layer's transport depends on.
//
// Implementations say their own threading contract; the pool calls Allocate once and Free once.

#ifndef FERRY_ENGINE_KV_KV_ALLOCATOR_H_
#define FERRY_ENGINE_KV_KV_ALLOCATOR_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace ferry {

// A contiguous byte range of device memory.
struct MemorySpan {
  void* address = nullptr;
  size_t length = 0;
};

// Supplies the pool's memory. The default takes it from a Backend; the transport provides one
// that registers the region for remote access.
class KvAllocator {
 public:
  virtual ~KvAllocator() = default;
  virtual absl::StatusOr<MemorySpan> Allocate(size_t bytes) = 0;
  virtual void Free(const MemorySpan& region) = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_KV_KV_ALLOCATOR_H_
