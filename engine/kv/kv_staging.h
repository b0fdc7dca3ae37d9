// Host access to a KV pool's blocks, for everything that moves KV out of or into a process: the
// prefill worker's push to a decode worker, the decode worker's landing, the KV store's writes
// and reads, the drain hand-off (ARCHITECTURE.md §3, §5). It is the one module that knows whether
// a pool's memory is host memory a transport can read and write in place, or device memory that
// must pass through a staging area of host memory.
//
//   In place (the CPU backend): the pool's own memory is host memory (registered with the KV
//   transport when there is one); Export and Import lend the blocks' own bytes; Commit does
//   nothing. No copy is ever made.
//
//   Staged (a GPU's pool; or any pool with --kv_staging=always, which is how CI tests this path
//   on the CPU backend): a staging area of block-sized slots of host memory, taken from
//   `host_allocator` (the transport's, so peers address it; else plain host memory), page-locked
//   by the pool's backend (PinHostMemory). Export copies the blocks' bytes into slots
//   (Backend::CopyBeside: from any thread, ordered after the kernels that wrote them); Import
//   lends empty slots, and Commit copies them into the blocks. Debian's UCX 1.13 has no CUDA
//   transports, so this copy is the price of a GPU's KV leaving the device; GPUDirect or
//   cuda_ipc would make the staged kind in-place behind this same interface.
//
//   auto host = staging.Export(blocks);           // host->spans(): the blocks' bytes
//   transport.Put(..., host->spans(), [host](absl::Status) { /* slots back */ });
//
//   auto landing = staging.Import(blocks);        // host memory a peer writes
//   ... once every write has landed: landing->Commit();   // into the blocks
//
// Bounded: a staging area holds capacity_blocks() slots; an Export or Import that needs more than
// are free fails at once with RESOURCE_EXHAUSTED (never waits: callers run on the engine's
// thread), and one that needs more than the area holds says how much it would take. Slots go back
// when the KvHostBlocks holding them is destroyed: a caller keeps it until no transfer can reach
// its memory any more.
//
// Thread-safe; KvHostBlocks may be destroyed on any thread. The pool, its backend and the host
// allocator must outlive the KvStaging, which must outlive every KvHostBlocks it lent (one
// destroyed while it lends slots logs an error and leaves its memory allocated).

#ifndef FERRY_ENGINE_KV_KV_STAGING_H_
#define FERRY_ENGINE_KV_KV_STAGING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/backends/backend.h"
#include "engine/kv/kv_allocator.h"
#include "engine/kv/kv_block_pool.h"

namespace ferry {

class KvStaging;

// Host memory holding (Export) or receiving (Import) the bytes of some blocks, one span per
// block in the order asked for. Holds its staging slots until destroyed.
class KvHostBlocks {
 public:
  ~KvHostBlocks();
  KvHostBlocks(const KvHostBlocks&) = delete;
  KvHostBlocks& operator=(const KvHostBlocks&) = delete;

  const std::vector<MemorySpan>& spans() const { return spans_; }
  const std::vector<BlockId>& blocks() const { return blocks_; }
  // An Import's: copies the first `count` spans (all: -1) into their blocks; the others are not
  // touched (a read that ended early). Nothing to do in place. The blocks must still be held.
  absl::Status Commit(int64_t count = -1);

 private:
  friend class KvStaging;
  KvHostBlocks(KvStaging* staging, std::vector<BlockId> blocks, std::vector<int32_t> slots,
               std::vector<MemorySpan> spans);

  KvStaging* staging_;
  std::vector<BlockId> blocks_;
  std::vector<int32_t> slots_;  // empty in place
  std::vector<MemorySpan> spans_;
};

class KvStaging {
 public:
  // The pool's own memory, lent in place (FailedPrecondition unless it is host memory).
  static absl::StatusOr<std::unique_ptr<KvStaging>> InPlace(KvBlockPool* pool);
  // A staging area of `capacity_blocks` slots (at least 1) from `host_allocator`.
  static absl::StatusOr<std::unique_ptr<KvStaging>> Staged(KvBlockPool* pool,
                                                           KvAllocator* host_allocator,
                                                           int64_t capacity_blocks);
  ~KvStaging();
  KvStaging(const KvStaging&) = delete;
  KvStaging& operator=(const KvStaging&) = delete;

  bool staged() const { return staged_; }
  KvBlockPool& pool() const { return *pool_; }
  // The host memory spans lie in: the pool's region in place, else the staging area (what a
  // transport registers and peers address).
  MemorySpan region() const { return region_; }
  int64_t capacity_blocks() const { return capacity_; }
  int64_t free_slots() const;
  // Unlocks the staging area's pages (idempotent; the destructor does it): before memory it
  // borrowed from a transport is freed with the transport, at a shutdown.
  void Unpin();

  // The bytes of `blocks` (allocated, complete), in host memory.
  absl::StatusOr<std::shared_ptr<KvHostBlocks>> Export(absl::Span<const BlockId> blocks);
  // Host memory to receive the bytes of `blocks` (allocated); Commit moves them in.
  absl::StatusOr<std::shared_ptr<KvHostBlocks>> Import(absl::Span<const BlockId> blocks);

 private:
  friend class KvHostBlocks;
  KvStaging(KvBlockPool* pool, bool staged, MemorySpan region, int64_t capacity,
            KvAllocator* host_allocator);
  absl::StatusOr<std::shared_ptr<KvHostBlocks>> Lend(absl::Span<const BlockId> blocks,
                                                     const char* what);
  void GiveBack(const std::vector<int32_t>& slots);

  KvBlockPool* const pool_;
  Backend* const backend_;
  const bool staged_;
  const MemorySpan region_;
  const int64_t capacity_;
  KvAllocator* const host_allocator_;  // staged: region_'s, freed on destruction
  mutable absl::Mutex mu_;
  bool pinned_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);  // free slots, lowest last
};

// Plain host memory (a staging area no transport reads: the KV store's, on a worker without a
// KV transport). Thread-safe.
class HostKvAllocator : public KvAllocator {
 public:
  absl::StatusOr<MemorySpan> Allocate(size_t bytes) override;
  void Free(const MemorySpan& region) override;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_KV_KV_STAGING_H_
