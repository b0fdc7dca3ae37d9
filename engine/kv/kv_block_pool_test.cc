#include "engine/kv/kv_block_pool.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

KvBlockLayout SmallLayout() {
  KvBlockLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.block_tokens = 4;
  l.dtype = DType::kBF16;
  return l;
}

// An allocator that records what it handed out, as a transport registering memory would.
class RecordingAllocator : public KvAllocator {
 public:
  absl::StatusOr<MemorySpan> Allocate(size_t bytes) override {
    memory_.resize(bytes);
    ++allocations;
    return MemorySpan{memory_.data(), bytes};
  }
  void Free(const MemorySpan& region) override {
    EXPECT_EQ(region.address, memory_.data());
    ++frees;
  }
  int allocations = 0, frees = 0;
  std::vector<char> memory_;
};

class KvBlockPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { backend_ = *CpuBackend::Create({1, std::nullopt}); }
  std::unique_ptr<CpuBackend> backend_;
};

TEST_F(KvBlockPoolTest, LayoutArithmetic) {
  const KvBlockLayout l = SmallLayout();
  EXPECT_EQ(l.head_bytes(), 4u * 8 * 2);
  EXPECT_EQ(l.layer_bytes(), 2u * 2 * 64);
  EXPECT_EQ(l.block_bytes(), 3u * 256);
  EXPECT_EQ(l.k_offset(1), 256u);
  EXPECT_EQ(l.v_offset(1), 256u + 128);
  EXPECT_EQ(l.BlocksFor(0), 0);
  EXPECT_EQ(l.BlocksFor(4), 1);
  EXPECT_EQ(l.BlocksFor(5), 2);
  KvBlockLayout bad = l;
  bad.block_tokens = 0;
  EXPECT_FALSE(bad.Validate().ok());
}

TEST_F(KvBlockPoolTest, LayoutTagsAreTheSpecifiedBytesHashed) {
  // Golden values from Python: xxhash.xxh3_64_intdigest(b"FERRYKVL" + struct.pack("<IIIIII", 1,
  // 2, layers, heads, dim, tokens) + struct.pack("<I", len(dtype)) + dtype.encode()).
  KvBlockLayout smollm2;
  smollm2.num_layers = 30;
  smollm2.num_kv_heads = 3;
  smollm2.head_dim = 64;
  smollm2.block_tokens = 64;
  smollm2.dtype = DType::kBF16;
  EXPECT_EQ(smollm2.Tag(), 0xcad025d131b950f9u);
  KvBlockLayout small;
  small.num_layers = 2;
  small.num_kv_heads = 1;
  small.head_dim = 4;
  small.block_tokens = 4;
  small.dtype = DType::kF32;
  EXPECT_EQ(small.Tag(), 0x90a8baec8e364e8bu);
  // Every field counts.
  for (int field = 0; field < 5; ++field) {
    KvBlockLayout other = smollm2;
    if (field == 0) other.num_layers = 29;
    if (field == 1) other.num_kv_heads = 4;
    if (field == 2) other.head_dim = 32;
    if (field == 3) other.block_tokens = 32;
    if (field == 4) other.dtype = DType::kF32;
    EXPECT_NE(other.Tag(), smollm2.Tag()) << field;
  }
}

TEST_F(KvBlockPoolTest, MemoryComesFromTheInjectedAllocatorAndGoesBack) {
  RecordingAllocator alloc;
  {
    auto pool = KvBlockPool::Create(SmallLayout(), 10, &alloc, backend_.get());
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(alloc.allocations, 1);
    EXPECT_EQ((*pool)->region().address, alloc.memory_.data());
    EXPECT_EQ((*pool)->region().length, 10 * SmallLayout().block_bytes());
  }
  EXPECT_EQ(alloc.frees, 1);
}

TEST_F(KvBlockPoolTest, AllocateAllOrNothingAndRefCounts) {
  BackendKvAllocator alloc(backend_.get());
  auto pool = *KvBlockPool::Create(SmallLayout(), 6, &alloc, backend_.get());
  auto a = pool->Allocate(4);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<BlockId>{0, 1, 2, 3}));
  EXPECT_EQ(pool->Allocate(3).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->num_free(), 2);
  ASSERT_TRUE(pool->AddRef({1}).ok());
  EXPECT_EQ(pool->ref_count(1), 2);
  ASSERT_TRUE(pool->Release(*a).ok());
  EXPECT_EQ(pool->num_free(), 5);  // block 1 still referenced
  EXPECT_EQ(pool->ref_count(1), 1);
  // Releasing a free block, an unknown block, or one block twice past its count changes nothing.
  EXPECT_EQ(pool->Release({0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Release({99}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Release({1, 1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->ref_count(1), 1);
  ASSERT_TRUE(pool->Release({1}).ok());
  EXPECT_EQ(pool->num_free(), 6);
  // Lowest ids first, whatever the release order.
  EXPECT_EQ(*pool->Allocate(2), (std::vector<BlockId>{0, 1}));
}

TEST_F(KvBlockPoolTest, SpansAreInPlaceAndImportWritesReservedBlocks) {
  BackendKvAllocator alloc(backend_.get());
  const KvBlockLayout layout = SmallLayout();
  auto src = *KvBlockPool::Create(layout, 8, &alloc, backend_.get());
  auto dst = *KvBlockPool::Create(layout, 8, &alloc, backend_.get());
  auto blocks = *src->Allocate(3);
  auto spans = src->Spans(blocks);
  ASSERT_TRUE(spans.ok());
  ASSERT_EQ(spans->size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ((*spans)[i].address,
              static_cast<char*>(src->region().address) + blocks[i] * layout.block_bytes());
    EXPECT_EQ((*spans)[i].length, layout.block_bytes());
    // Fill through the span: it is the pool's own memory.
    std::memset((*spans)[i].address, 0x10 + static_cast<int>(i), (*spans)[i].length);
  }
  std::vector<char> host(3 * layout.block_bytes());
  ASSERT_TRUE(src->ExportToHost(blocks, host.data(), host.size()).ok());
  (void)dst->Allocate(2);  // so the import lands on other ids
  auto reserved = *dst->Allocate(3);
  EXPECT_EQ(reserved, (std::vector<BlockId>{2, 3, 4}));
  ASSERT_TRUE(dst->Import(reserved, host.data(), host.size()).ok());
  auto dst_spans = *dst->Spans(reserved);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(0, std::memcmp(dst_spans[i].address, (*spans)[i].address, layout.block_bytes()));
  }
  EXPECT_EQ(dst->Import(reserved, host.data(), host.size() - 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dst->Import({7}, host.data(), layout.block_bytes()).code(),
            absl::StatusCode::kFailedPrecondition);  // not reserved
  EXPECT_FALSE(src->Spans({5}).ok());
}

TEST_F(KvBlockPoolTest, LayerViewAddressesMatchTheLayout) {
  BackendKvAllocator alloc(backend_.get());
  const KvBlockLayout layout = SmallLayout();
  auto pool = *KvBlockPool::Create(layout, 2, &alloc, backend_.get());
  const KvLayerView v = pool->LayerView(2);
  EXPECT_EQ(v.base, pool->region().address);
  EXPECT_EQ(v.block_bytes, layout.block_bytes());
  EXPECT_EQ(v.k_offset, layout.k_offset(2));
  EXPECT_EQ(v.v_offset, layout.v_offset(2));
  EXPECT_EQ(v.dtype, DType::kBF16);
}

TEST_F(KvBlockPoolTest, CreateRejectsBadArguments) {
  BackendKvAllocator alloc(backend_.get());
  EXPECT_FALSE(KvBlockPool::Create(SmallLayout(), 0, &alloc, backend_.get()).ok());
  KvBlockLayout bad = SmallLayout();
  bad.num_layers = 0;
  EXPECT_FALSE(KvBlockPool::Create(bad, 4, &alloc, backend_.get()).ok());
}

}  // namespace
}  // namespace ferry
