// glibc's allocator, tuned for processes that move KV blocks through gRPC messages (the KV store
// node, workers reading from it, their benchmarks).
//
// A message of a MiB or more is a fresh allocation; by default glibc serves it with mmap and
// returns it to the kernel when freed, so every message faults its pages in and has the kernel
// zero them again: half of ferry-kvstore's CPU, and a third of a worker's read of 90 MB from the
// store, went to that. TuneAllocatorForLargeBuffers raises the mmap threshold to 64 MiB and the
// trim threshold to 1 GiB, so freed buffers are reused. (Larger buffers, the KV pools and the
// weights, are still mapped, once.) Call once at the start of the process, before its threads.

#ifndef FERRY_SERVICES_COMMON_ALLOCATOR_TUNING_H_
#define FERRY_SERVICES_COMMON_ALLOCATOR_TUNING_H_

namespace ferry {

void TuneAllocatorForLargeBuffers();

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_ALLOCATOR_TUNING_H_
