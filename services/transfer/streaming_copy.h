// StreamingCopy: memcpy for bytes that land in memory no one will read soon (a KV block another
// process pushed, which the engine reads at its next step at the earliest).
//
// A plain memcpy into memory not in any cache reads every destination line before writing it
// (read-for-ownership): half the memory traffic is that read. Non-temporal stores skip it, at the
// price of leaving the bytes out of the cache. Measured on this project's 2-core VM, 48 KiB copies
// into 94 MB of uncached memory: 7.6-8.8 GB/s with memcpy, 18-23 GB/s streamed.
//
// Thread-safe (no state). The stores are fenced before return, so the bytes are visible to any
// thread that synchronizes with the caller afterwards, as after a memcpy. Any alignment and length;
// on a CPU without SSE2 (not x86-64) it is memcpy.

#ifndef FERRY_SERVICES_TRANSFER_STREAMING_COPY_H_
#define FERRY_SERVICES_TRANSFER_STREAMING_COPY_H_

#include <cstddef>

namespace ferry {
namespace transfer {

// Copies `length` bytes from `src` to `dst` (which may not overlap).
void StreamingCopy(void* dst, const void* src, size_t length);

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_STREAMING_COPY_H_
