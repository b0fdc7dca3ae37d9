#include "engine/kv/kv_block_pool.h"

#include <xxhash.h>

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/common/le_encoding.h"
#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"

namespace ferry {

absl::Status KvBlockLayout::Validate() const {
  if (num_layers <= 0 || num_kv_heads <= 0 || head_dim <= 0 || block_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("invalid KV layout: ", DebugString()));
  }
  return absl::OkStatus();
}

uint64_t KvBlockLayout::Tag() const {
  std::string bytes = "FERRYKVL";
  AppendU32Le(&bytes, 1);
  AppendU32Le(&bytes, kKvFormatVersion);
  AppendU32Le(&bytes, static_cast<uint32_t>(num_layers));
  AppendU32Le(&bytes, static_cast<uint32_t>(num_kv_heads));
  AppendU32Le(&bytes, static_cast<uint32_t>(head_dim));
  AppendU32Le(&bytes, static_cast<uint32_t>(block_tokens));
  AppendLengthPrefixed(&bytes, DTypeName(dtype));
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::string KvBlockLayout::DebugString() const {
  return absl::StrFormat("%d layers x %d kv heads x %d dims, %d tokens per block, %s", num_layers,
                         num_kv_heads, head_dim, block_tokens, DTypeName(dtype));
}

absl::StatusOr<MemorySpan> BackendKvAllocator::Allocate(size_t bytes) {
  auto buffer = backend_->Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  MemorySpan span{buffer->data(), bytes};
  // Every page faulted in now, with a byte that is not zero (see the header), rather than on the
  // first write of a block: a KV store read of 90 MB into blocks never touched took 100 ms more.
  constexpr size_t kPage = 4096;
  if (backend_->host_memory()) {
    auto* memory = static_cast<unsigned char*>(span.address);
    for (size_t offset = 0; offset < bytes; offset += kPage) memory[offset] = 1;
  }
  absl::MutexLock lock(&mu_);
  buffers_.push_back(std::move(*buffer));
  return span;
}

void BackendKvAllocator::Free(const MemorySpan& region) {
  absl::MutexLock lock(&mu_);
  buffers_.erase(std::remove_if(buffers_.begin(), buffers_.end(),
                                [&](const DeviceBuffer& b) { return b.data() == region.address; }),
                 buffers_.end());
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(const KvBlockLayout& layout,
                                                                 int64_t num_blocks,
                                                                 KvAllocator* allocator,
                                                                 Backend* backend) {
  if (absl::Status s = layout.Validate(); !s.ok()) return s;
  if (num_blocks <= 0 || num_blocks > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat("invalid KV block count ", num_blocks));
  }
  const size_t bytes = layout.block_bytes() * static_cast<size_t>(num_blocks);
  auto region = allocator->Allocate(bytes);
  if (!region.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool of ", num_blocks, " blocks (", bytes,
                                                     " bytes): ", region.status().message()));
  }
  return std::unique_ptr<KvBlockPool>(
      new KvBlockPool(layout, num_blocks, allocator, backend, *region));
}

KvBlockPool::KvBlockPool(const KvBlockLayout& layout, int64_t num_blocks, KvAllocator* allocator,
                         Backend* backend, MemorySpan region)
    : layout_(layout),
      num_blocks_(num_blocks),
      allocator_(allocator),
      backend_(backend),
      region_(region),
      ref_counts_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int64_t b = 0; b < num_blocks; ++b) free_.push_back(static_cast<BlockId>(b));
  // Ascending order is already a min-heap.
}

KvBlockPool::~KvBlockPool() { allocator_->Free(region_); }

int64_t KvBlockPool::num_free() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_.size());
}

absl::StatusOr<std::vector<BlockId>> KvBlockPool::Allocate(int64_t n) {
  absl::MutexLock lock(&mu_);
  if (n < 0 || n > static_cast<int64_t>(free_.size())) {
    return absl::ResourceExhaustedError(absl::StrCat("KV pool: ", n, " blocks requested, ",
                                                     free_.size(), " free of ", num_blocks_));
  }
  std::vector<BlockId> out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<BlockId>());
    out.push_back(free_.back());
    free_.pop_back();
    ref_counts_[out.back()] = 1;
  }
  return out;
}

absl::Status KvBlockPool::CheckAllocated(absl::Span<const BlockId> blocks) const {
  for (BlockId b : blocks) {
    if (b < 0 || b >= num_blocks_) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV block ", b, " out of range [0, ", num_blocks_, ")"));
    }
    if (ref_counts_[b] == 0) {
      return absl::FailedPreconditionError(absl::StrCat("KV block ", b, " is not allocated"));
    }
  }
  return absl::OkStatus();
}

absl::Status KvBlockPool::AddRef(absl::Span<const BlockId> blocks) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckAllocated(blocks); !s.ok()) return s;
  for (BlockId b : blocks) ++ref_counts_[b];
  return absl::OkStatus();
}

void KvBlockPool::SetFreeListener(std::function<void()> listener) {
  absl::MutexLock lock(&listener_mu_);
  listener_ = std::move(listener);
}

absl::Status KvBlockPool::Release(absl::Span<const BlockId> blocks) {
  bool freed = false;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(ReleaseLocked(blocks, &freed));
  }
  if (freed) {
    absl::MutexLock lock(&listener_mu_);
    if (listener_) listener_();
  }
  return absl::OkStatus();
}

absl::Status KvBlockPool::ReleaseLocked(absl::Span<const BlockId> blocks, bool* freed) {
  if (absl::Status s = CheckAllocated(blocks); !s.ok()) return s;
  // A block listed twice must hold two references.
  std::vector<BlockId> sorted(blocks.begin(), blocks.end());
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    if (static_cast<int32_t>(j - i) > ref_counts_[sorted[i]]) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV block ", sorted[i], " released more times than referenced"));
    }
    i = j;
  }
  for (BlockId b : blocks) {
    if (--ref_counts_[b] == 0) {
      free_.push_back(b);
      std::push_heap(free_.begin(), free_.end(), std::greater<BlockId>());
      *freed = true;
    }
  }
  return absl::OkStatus();
}

int32_t KvBlockPool::ref_count(BlockId block) const {
  absl::MutexLock lock(&mu_);
  return block >= 0 && block < num_blocks_ ? ref_counts_[block] : 0;
}

absl::StatusOr<std::vector<MemorySpan>> KvBlockPool::Spans(absl::Span<const BlockId> blocks) const {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckAllocated(blocks); !s.ok()) return s;
  std::vector<MemorySpan> spans;
  spans.reserve(blocks.size());
  for (BlockId b : blocks) {
    spans.push_back(
        {static_cast<char*>(region_.address) + b * layout_.block_bytes(), layout_.block_bytes()});
  }
  return spans;
}

absl::Status KvBlockPool::Import(absl::Span<const BlockId> blocks, const void* host_bytes,
                                 size_t bytes) {
  if (bytes != blocks.size() * layout_.block_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("KV import of ", bytes, " bytes into ",
                                                   blocks.size(), " blocks of ",
                                                   layout_.block_bytes(), " bytes"));
  }
  auto spans = Spans(blocks);
  if (!spans.ok()) return spans.status();
  const char* src = static_cast<const char*>(host_bytes);
  for (const MemorySpan& s : *spans) {
    backend_->CopyToDevice(s.address, src, s.length);
    src += s.length;
  }
  return absl::OkStatus();
}

absl::Status KvBlockPool::CopyBlock(BlockId from, BlockId to) {
  const BlockId both[] = {from, to};
  auto spans = Spans(both);
  if (!spans.ok()) return spans.status();
  if (from != to)
    backend_->CopyOnDevice((*spans)[1].address, (*spans)[0].address, (*spans)[0].length);
  return absl::OkStatus();
}

absl::Status KvBlockPool::ExportToHost(absl::Span<const BlockId> blocks, void* host_bytes,
                                       size_t bytes) const {
  if (bytes != blocks.size() * layout_.block_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV export of ", blocks.size(), " blocks into ", bytes, " bytes"));
  }
  auto spans = Spans(blocks);
  if (!spans.ok()) return spans.status();
  char* dst = static_cast<char*>(host_bytes);
  for (const MemorySpan& s : *spans) {
    backend_->CopyToHost(dst, s.address, s.length);
    dst += s.length;
  }
  return absl::OkStatus();
}

KvLayerView KvBlockPool::LayerView(int32_t layer) const {
  KvLayerView v;
  v.base = region_.address;
  v.block_bytes = layout_.block_bytes();
  v.k_offset = layout_.k_offset(layer);
  v.v_offset = layout_.v_offset(layer);
  v.block_tokens = layout_.block_tokens;
  v.kv_heads = layout_.num_kv_heads;
  v.head_dim = layout_.head_dim;
  v.dtype = layout_.dtype;
  return v;
}

}  // namespace ferry
