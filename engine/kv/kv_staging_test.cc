#include "engine/kv/kv_staging.h"

#include <cstring>
#include <thread>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

KvBlockLayout SmallLayout() {
  KvBlockLayout l;
  l.num_layers = 2;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.block_tokens = 4;
  l.dtype = DType::kBF16;
  return l;
}

// Counts what it hands out, as a transport registering the staging area would.
class CountingAllocator : public KvAllocator {
 public:
  absl::StatusOr<MemorySpan> Allocate(size_t bytes) override {
    ++allocations;
    return host_.Allocate(bytes);
  }
  void Free(const MemorySpan& region) override {
    ++frees;
    host_.Free(region);
  }
  int allocations = 0, frees = 0;

 private:
  HostKvAllocator host_;
};

class KvStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *CpuBackend::Create({1, std::nullopt});
    pool_ = *KvBlockPool::Create(SmallLayout(), 8, &pool_memory_, backend_.get());
    blocks_ = *pool_->Allocate(4);
    // Block i holds bytes i*16 + (offset % 16): every block and every offset tells itself apart.
    const size_t bb = pool_->layout().block_bytes();
    std::vector<char> bytes(blocks_.size() * bb);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i / bb) * 16 + i % 16);
    ASSERT_TRUE(pool_->Import(blocks_, bytes.data(), bytes.size()).ok());
  }
  std::vector<char> BlockBytes(BlockId b) {
    std::vector<char> out(pool_->layout().block_bytes());
    EXPECT_TRUE(pool_->ExportToHost({b}, out.data(), out.size()).ok());
    return out;
  }
  static std::vector<char> Bytes(const MemorySpan& s) {
    const char* p = static_cast<const char*>(s.address);
    return std::vector<char>(p, p + s.length);
  }

  HostKvAllocator pool_memory_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<KvBlockPool> pool_;
  std::vector<BlockId> blocks_;
};

TEST_F(KvStagingTest, InPlaceLendsThePoolsOwnBytes) {
  auto staging = KvStaging::InPlace(pool_.get());
  ASSERT_TRUE(staging.ok()) << staging.status();
  EXPECT_FALSE((*staging)->staged());
  EXPECT_EQ((*staging)->region().address, pool_->region().address);
  auto host = (*staging)->Export({blocks_[2], blocks_[0]});
  ASSERT_TRUE(host.ok()) << host.status();
  auto in_pool = pool_->Spans({blocks_[2], blocks_[0]});
  ASSERT_EQ((*host)->spans().size(), 2u);
  EXPECT_EQ((*host)->spans()[0].address, (*in_pool)[0].address);
  EXPECT_EQ((*host)->spans()[1].address, (*in_pool)[1].address);
  auto landing = (*staging)->Import({blocks_[1]});
  ASSERT_TRUE(landing.ok());
  std::memset((*landing)->spans()[0].address, 7, (*landing)->spans()[0].length);
  EXPECT_TRUE((*landing)->Commit().ok());  // written in place already
  EXPECT_EQ(BlockBytes(blocks_[1]), std::vector<char>(pool_->layout().block_bytes(), 7));
  // A block that is not allocated is an error, as the pool's own Spans says.
  EXPECT_FALSE((*staging)->Export({7}).ok());
}

TEST_F(KvStagingTest, StagedExportCopiesAndImportCommitsOnlyWhatItIsTold) {
  CountingAllocator host;
  {
    auto staging = KvStaging::Staged(pool_.get(), &host, 3);
    ASSERT_TRUE(staging.ok()) << staging.status();
    KvStaging& s = **staging;
    EXPECT_TRUE(s.staged());
    EXPECT_EQ(s.region().length, 3 * pool_->layout().block_bytes());
    EXPECT_EQ(host.allocations, 1);

    auto exported = s.Export({blocks_[3], blocks_[1]});
    ASSERT_TRUE(exported.ok()) << exported.status();
    const auto& spans = (*exported)->spans();
    ASSERT_EQ(spans.size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const auto address = reinterpret_cast<uintptr_t>(spans[i].address);
      const auto base = reinterpret_cast<uintptr_t>(s.region().address);
      EXPECT_TRUE(address >= base && address + spans[i].length <= base + s.region().length);
    }
    EXPECT_EQ(Bytes(spans[0]), BlockBytes(blocks_[3]));
    EXPECT_EQ(Bytes(spans[1]), BlockBytes(blocks_[1]));
    EXPECT_EQ(s.free_slots(), 1);

    // Only one slot is free: an import of two fails at once and takes nothing.
    auto refused = s.Import({blocks_[0], blocks_[2]});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(refused.status().message().find("1 of the staging area's 3 slots are free"),
              std::string::npos)
        << refused.status();
    EXPECT_EQ(s.free_slots(), 1);
    // More than the area holds: says what it would take.
    auto too_big = s.Export({blocks_[0], blocks_[1], blocks_[2], blocks_[3]});
    EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(too_big.status().message().find("--kv_staging_bytes"), std::string::npos);
    exported->reset();
    EXPECT_EQ(s.free_slots(), 3);

    // An import lands in the slots; Commit(1) moves the first block only.
    const std::vector<char> before2 = BlockBytes(blocks_[2]);
    auto landing = s.Import({blocks_[0], blocks_[2]});
    ASSERT_TRUE(landing.ok()) << landing.status();
    std::memset((*landing)->spans()[0].address, 5, (*landing)->spans()[0].length);
    std::memset((*landing)->spans()[1].address, 6, (*landing)->spans()[1].length);
    ASSERT_TRUE((*landing)->Commit(1).ok());
    EXPECT_EQ(BlockBytes(blocks_[0]), std::vector<char>(pool_->layout().block_bytes(), 5));
    EXPECT_EQ(BlockBytes(blocks_[2]), before2);
    ASSERT_TRUE((*landing)->Commit().ok());
    EXPECT_EQ(BlockBytes(blocks_[2]), std::vector<char>(pool_->layout().block_bytes(), 6));
    // A block freed meanwhile: the commit says so and writes nothing.
    ASSERT_TRUE(pool_->Release({blocks_[2]}).ok());
    EXPECT_FALSE((*landing)->Commit().ok());
    landing->reset();
    EXPECT_EQ(s.free_slots(), 3);
  }
  EXPECT_EQ(host.frees, 1);
}

TEST_F(KvStagingTest, SlotsComeBackFromEveryThread) {
  HostKvAllocator host;
  auto staging = KvStaging::Staged(pool_.get(), &host, 4);
  ASSERT_TRUE(staging.ok());
  KvStaging& s = **staging;
  std::vector<std::thread> threads;
  std::atomic<int> lent{0}, refused{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto got =
            (t % 2 == 0) ? s.Export({blocks_[t], blocks_[(t + 1) % 4]}) : s.Import({blocks_[t]});
        if (got.ok()) {
          ++lent;
          if (t % 2 == 0) {
            EXPECT_EQ(Bytes((*got)->spans()[0]), BlockBytes(blocks_[t]));
          }
        } else {
          EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted);
          ++refused;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(lent + refused, 800);
  EXPECT_GT(lent.load(), 0);
  EXPECT_EQ(s.free_slots(), 4);
}

TEST_F(KvStagingTest, ABadCapacityIsRefused) {
  HostKvAllocator host;
  EXPECT_EQ(KvStaging::Staged(pool_.get(), &host, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
