#include "engine/kv/kv_staging.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"

namespace ferry {

KvHostBlocks::KvHostBlocks(KvStaging* staging, std::vector<BlockId> blocks,
                           std::vector<int32_t> slots, std::vector<MemorySpan> spans)
    : staging_(staging),
      blocks_(std::move(blocks)),
      slots_(std::move(slots)),
      spans_(std::move(spans)) {}

KvHostBlocks::~KvHostBlocks() {
  if (!slots_.empty()) staging_->GiveBack(slots_);
}

absl::Status KvHostBlocks::Commit(int64_t count) {
  const size_t n = count < 0 ? spans_.size() : std::min(spans_.size(), static_cast<size_t>(count));
  if (slots_.empty() || n == 0) return absl::OkStatus();
  auto targets = staging_->pool_->Spans(absl::MakeConstSpan(blocks_).subspan(0, n));
  if (!targets.ok()) return targets.status();
  std::vector<Backend::BesideCopy> copies(n);
  for (size_t i = 0; i < n; ++i) {
    copies[i] = {(*targets)[i].address, spans_[i].address, spans_[i].length};
  }
  absl::Status copied = staging_->backend_->CopyBeside(copies, /*to_device=*/true);
  if (!copied.ok()) {
    return absl::Status(copied.code(),
                        absl::StrCat("KV staging into ", n, " blocks: ", copied.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvStaging>> KvStaging::InPlace(KvBlockPool* pool) {
  Backend* backend = pool->backend();
  if (!backend->host_memory()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the KV pool is in ", backend->name(), "'s device memory: its blocks must be staged"));
  }
  return std::unique_ptr<KvStaging>(
      new KvStaging(pool, /*staged=*/false, pool->region(), 0, nullptr));
}

absl::StatusOr<std::unique_ptr<KvStaging>> KvStaging::Staged(KvBlockPool* pool,
                                                             KvAllocator* host_allocator,
                                                             int64_t capacity_blocks) {
  Backend* backend = pool->backend();
  if (capacity_blocks < 1 || capacity_blocks > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a KV staging area of ", capacity_blocks, " blocks"));
  }
  const size_t bytes = static_cast<size_t>(capacity_blocks) * pool->layout().block_bytes();
  auto region = host_allocator->Allocate(bytes);
  if (!region.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("a KV staging area of ", capacity_blocks,
                                                     " blocks (", bytes,
                                                     " bytes): ", region.status().message()));
  }
  std::unique_ptr<KvStaging> staging(
      new KvStaging(pool, /*staged=*/true, *region, capacity_blocks, host_allocator));
  absl::Status pinned = backend->PinHostMemory(region->address, region->length);
  if (!pinned.ok()) {
    // Pageable memory still works, at a fraction of the link's speed: said, not refused.
    LOG(WARNING) << "the KV staging area is not page-locked (copies will be slower): " << pinned;
  }
  {
    absl::MutexLock lock(&staging->mu_);
    staging->pinned_ = pinned.ok();
  }
  return staging;
}

KvStaging::KvStaging(KvBlockPool* pool, bool staged, MemorySpan region, int64_t capacity,
                     KvAllocator* host_allocator)
    : pool_(pool),
      backend_(pool->backend()),
      staged_(staged),
      region_(region),
      capacity_(capacity),
      host_allocator_(host_allocator) {
  free_.reserve(static_cast<size_t>(capacity));
  for (int64_t i = capacity - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

KvStaging::~KvStaging() {
  if (!staged_) return;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int64_t>(free_.size()) != capacity_) {
      // Memory a transfer may still reach is never handed back (a shutdown's last moments).
      LOG(ERROR) << "a KV staging area destroyed while it lends "
                 << capacity_ - static_cast<int64_t>(free_.size()) << " slots: left allocated";
      return;
    }
  }
  Unpin();
  host_allocator_->Free(region_);
}

void KvStaging::Unpin() {
  absl::MutexLock lock(&mu_);
  if (!pinned_) return;
  backend_->UnpinHostMemory(region_.address);
  pinned_ = false;
}

int64_t KvStaging::free_slots() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

absl::StatusOr<std::shared_ptr<KvHostBlocks>> KvStaging::Lend(absl::Span<const BlockId> blocks,
                                                              const char* what) {
  auto in_pool = pool_->Spans(blocks);
  if (!in_pool.ok()) return in_pool.status();
  std::vector<BlockId> ids(blocks.begin(), blocks.end());
  if (!staged_) {
    return std::shared_ptr<KvHostBlocks>(
        new KvHostBlocks(this, std::move(ids), {}, *std::move(in_pool)));
  }
  const int64_t n = static_cast<int64_t>(blocks.size());
  if (n > capacity_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "KV ", what, " of ", n, " blocks through a staging area of ", capacity_,
        " blocks: it needs --kv_staging_bytes of at least ", n * pool_->layout().block_bytes()));
  }
  std::vector<int32_t> slots;
  {
    absl::MutexLock lock(&mu_);
    if (static_cast<int64_t>(free_.size()) < n) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV ", what, " of ", n, " blocks: ", free_.size(), " of the staging area's ",
                       capacity_, " slots are free"));
    }
    slots.assign(free_.end() - n, free_.end());
    free_.resize(free_.size() - static_cast<size_t>(n));
  }
  const size_t block_bytes = pool_->layout().block_bytes();
  std::vector<MemorySpan> spans;
  spans.reserve(slots.size());
  for (int32_t slot : slots) {
    spans.push_back({static_cast<char*>(region_.address) + slot * block_bytes, block_bytes});
  }
  return std::shared_ptr<KvHostBlocks>(
      new KvHostBlocks(this, std::move(ids), std::move(slots), std::move(spans)));
}

void KvStaging::GiveBack(const std::vector<int32_t>& slots) {
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), slots.rbegin(), slots.rend());
}

absl::StatusOr<std::shared_ptr<KvHostBlocks>> KvStaging::Export(absl::Span<const BlockId> blocks) {
  auto lent = Lend(blocks, "export");
  if (!lent.ok() || !staged_) return lent;
  auto in_pool = pool_->Spans(blocks);
  if (!in_pool.ok()) return in_pool.status();
  const std::vector<MemorySpan>& host = (*lent)->spans();
  std::vector<Backend::BesideCopy> copies(host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    copies[i] = {host[i].address, (*in_pool)[i].address, host[i].length};
  }
  absl::Status copied = backend_->CopyBeside(copies, /*to_device=*/false);
  if (!copied.ok()) {
    return absl::Status(copied.code(),
                        absl::StrCat("KV staging of ", host.size(), " blocks: ", copied.message()));
  }
  return lent;
}

absl::StatusOr<std::shared_ptr<KvHostBlocks>> KvStaging::Import(absl::Span<const BlockId> blocks) {
  return Lend(blocks, "import");
}

absl::StatusOr<MemorySpan> HostKvAllocator::Allocate(size_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t rounded = (std::max<size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
  }
  // Committed now, not on first use (see kv_block_pool.h BackendKvAllocator).
  auto* memory = static_cast<unsigned char*>(p);
  for (size_t offset = 0; offset < rounded; offset += kPage) memory[offset] = 1;
  return MemorySpan{p, bytes};
}

void HostKvAllocator::Free(const MemorySpan& region) { std::free(region.address); }

}  // namespace ferry
