// The paged KV cache (ARCHITECTURE.md §4 "KV cache"): a pool of fixed-size blocks, each holding
// the keys and values of `block_tokens` consecutive positions of one sequence for every layer.
//
// Block layout (KvBlockLayout; kKvFormatVersion 2 in engine/common/model_fingerprint.h):
//   [layer][K: [kv_head][head_dim][slot], V: [kv_head][slot][head_dim]]
// Keys are stored column-wise so that attention loads one dimension of adjacent keys as a vector;
// values row-wise so that it adds whole value rows. A block is one contiguous byte range:
// exporting blocks gives (address, length) spans into the pool itself, never copies.
//
// The pool's memory is one region from an injected KvAllocator, so the KV transport can supply
// memory it has registered with the NIC. Blocks are reference counted: Allocate returns blocks
// with one reference; Release drops one and frees the block at zero (the prefix cache will hold
// its own references).
//
// Thread-safe.

#ifndef FERRY_ENGINE_KV_KV_BLOCK_POOL_H_
#define FERRY_ENGINE_KV_KV_BLOCK_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/backends/backend.h"
#include "engine/kv/kv_allocator.h"

namespace ferry {

using BlockId = int32_t;
// A block-table entry with no block (a sliding-window table's blocks before the window).
inline constexpr BlockId kNoBlock = -1;

struct KvBlockLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_tokens = 64;
  DType dtype = DType::kBF16;

  size_t head_bytes() const {
    return static_cast<size_t>(block_tokens) * head_dim * DTypeBytes(dtype);
  }
  size_t layer_bytes() const { return 2 * static_cast<size_t>(num_kv_heads) * head_bytes(); }
  size_t block_bytes() const { return static_cast<size_t>(num_layers) * layer_bytes(); }
  size_t k_offset(int32_t layer) const { return layer * layer_bytes(); }
  size_t v_offset(int32_t layer) const { return k_offset(layer) + num_kv_heads * head_bytes(); }
  // Blocks needed for `tokens` positions.
  int64_t BlocksFor(int64_t tokens) const { return (tokens + block_tokens - 1) / block_tokens; }
  absl::Status Validate() const;
  std::string DebugString() const;
  // The layout as the KV store's objects name it (ObjectMeta::layout_tag): XXH3-64 (seed 0) of
  // exactly these bytes, little-endian:
  //
  //   "FERRYKVL"  u32 tag version (1)  u32 kKvFormatVersion (model_fingerprint.h)
  //   u32 num_layers  u32 num_kv_heads  u32 head_dim  u32 block_tokens
  //   u32 len(dtype name) dtype name ("f32", "bf16")
  //
  // A reader takes an object only when its tag is its own pool's: the same fingerprint and hash
  // chain on another layout (the full-attention layers' pool of a hybrid model against all layers
  // in one pool, another KV format) is a miss, never bytes read as something they are not.
  uint64_t Tag() const;
};

// Device memory from a Backend. Host memory (the CPU backend) is faulted in at once, one byte
// that is not zero per 4 KiB page (a finite value in every KV element type; nothing reads a block
// before writing it): the pool's pages are committed from the start, and memory the kernel zeroed
// and nothing wrote since is never found slow to write on first use (a virtual machine's host may
// take all-zero pages back; services/transfer/kv_transport.h TransportKvAllocator does the same).
class BackendKvAllocator : public KvAllocator {
 public:
  explicit BackendKvAllocator(Backend* backend) : backend_(backend) {}
  absl::StatusOr<MemorySpan> Allocate(size_t bytes) override;
  void Free(const MemorySpan& region) override;

 private:
  Backend* backend_;
  absl::Mutex mu_;
  std::vector<DeviceBuffer> buffers_ ABSL_GUARDED_BY(mu_);
};

class KvBlockPool {
 public:
  // `allocator` and `backend` must outlive the pool.
  static absl::StatusOr<std::unique_ptr<KvBlockPool>> Create(const KvBlockLayout& layout,
                                                             int64_t num_blocks,
                                                             KvAllocator* allocator,
                                                             Backend* backend);
  ~KvBlockPool();
  KvBlockPool(const KvBlockPool&) = delete;
  KvBlockPool& operator=(const KvBlockPool&) = delete;

  const KvBlockLayout& layout() const { return layout_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t num_free() const;
  // The whole region (for registration with a transport).
  MemorySpan region() const { return region_; }
  // The backend whose memory the blocks are (kv_staging.h copies beside it).
  Backend* backend() const { return backend_; }

  // `n` blocks with one reference each, lowest ids first; all or nothing
  // (ResourceExhausted when fewer are free).
  absl::StatusOr<std::vector<BlockId>> Allocate(int64_t n);
  // One more reference to each (allocated) block.
  absl::Status AddRef(absl::Span<const BlockId> blocks);
  // Drops one reference to each block; a block whose count reaches zero is free again. Unknown
  // or free blocks are an error and change nothing.
  absl::Status Release(absl::Span<const BlockId> blocks);
  // Called (on the releasing thread, after the pool's lock is dropped) whenever a Release frees
  // at least one block: the engine uses it to wake when another thread gives blocks back. Must
  // not call back into the pool's Release. Empty clears it.
  void SetFreeListener(std::function<void()> listener);
  int32_t ref_count(BlockId block) const;

  // In-place (address, length) of each block, in order: the bytes to send when exporting, or
  // the destination for a transport writing an import. Blocks must be allocated.
  absl::StatusOr<std::vector<MemorySpan>> Spans(absl::Span<const BlockId> blocks) const;
  // Imports host bytes (blocks.size() * block_bytes, in block order, this layout) into allocated
  // blocks reserved for them.
  absl::Status Import(absl::Span<const BlockId> blocks, const void* host_bytes, size_t bytes);
  // Copies block `from` onto block `to` on the device (both allocated): a sequence that forks
  // (the `n` choices of a request) gets its own copy of a shared partial block.
  absl::Status CopyBlock(BlockId from, BlockId to);
  // Copies the blocks' bytes to host memory (for tests and the SSD store's writer).
  absl::Status ExportToHost(absl::Span<const BlockId> blocks, void* host_bytes, size_t bytes) const;

  // The view of one layer for attention kernels.
  KvLayerView LayerView(int32_t layer) const;

 private:
  KvBlockPool(const KvBlockLayout& layout, int64_t num_blocks, KvAllocator* allocator,
              Backend* backend, MemorySpan region);
  absl::Status CheckAllocated(absl::Span<const BlockId> blocks) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReleaseLocked(absl::Span<const BlockId> blocks, bool* freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvBlockLayout layout_;
  const int64_t num_blocks_;
  KvAllocator* const allocator_;
  Backend* const backend_;
  const MemorySpan region_;

  mutable absl::Mutex mu_;
  std::vector<int32_t> ref_counts_ ABSL_GUARDED_BY(mu_);
  // A min-heap: allocation takes the lowest free ids, whatever the order of releases.
  std::vector<BlockId> free_ ABSL_GUARDED_BY(mu_);

  absl::Mutex listener_mu_;
  std::function<void()> listener_ ABSL_GUARDED_BY(listener_mu_);
};

}  // namespace ferry

#endif  // FERRY_ENGINE_KV_KV_BLOCK_POOL_H_
