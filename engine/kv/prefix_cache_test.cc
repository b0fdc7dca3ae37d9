#include "engine/kv/prefix_cache.h"

#include <cstring>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *CpuBackend::Create({1, std::nullopt});
    KvBlockLayout l;
    l.num_layers = 2;
    l.num_kv_heads = 1;
    l.head_dim = 4;
    l.block_tokens = 4;
    l.dtype = DType::kF32;
    allocator_ = std::make_unique<BackendKvAllocator>(backend_.get());
    pool_ = *KvBlockPool::Create(l, 8, allocator_.get(), backend_.get());
  }
  static Hash128 H(uint64_t i) { return Hash128{i, i * 7}; }
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<BackendKvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_;
};

TEST_F(PrefixCacheTest, LongestPrefixWithReferencesForTheCaller) {
  PrefixCache cache(pool_.get(), 1 << 20);
  auto blocks = *pool_->Allocate(3);
  cache.Insert({H(1), H(2), H(3)}, blocks);
  EXPECT_EQ(cache.blocks(), 3);
  for (BlockId b : blocks) EXPECT_EQ(pool_->ref_count(b), 2);  // request + cache
  ASSERT_TRUE(pool_->Release(blocks).ok());                    // the request ends

  // A chain sharing the first two blocks: two found, each with a reference for the caller.
  auto found = cache.Lookup({H(1), H(2), H(9), H(3)});
  ASSERT_EQ(found, (std::vector<BlockId>{blocks[0], blocks[1]}));
  EXPECT_EQ(pool_->ref_count(blocks[0]), 2);
  EXPECT_TRUE(cache.Lookup({H(9)}).empty());
  EXPECT_EQ(cache.lookups(), 2);
  EXPECT_EQ(cache.hit_blocks(), 2);
  ASSERT_TRUE(pool_->Release(found).ok());
  // Inserting an already-cached hash takes no second reference.
  cache.Insert({H(1)}, {blocks[0]});
  EXPECT_EQ(pool_->ref_count(blocks[0]), 1);

  auto events = cache.TakeEvents();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, KvCacheEvent::Kind::kStored);
  EXPECT_EQ(events[2].hash, H(3));
  EXPECT_TRUE(cache.TakeEvents().empty());
}

TEST_F(PrefixCacheTest, EvictsLeastRecentlyUsedUnreferencedBlocksOnly) {
  const int64_t block = static_cast<int64_t>(pool_->layout().block_bytes());
  PrefixCache cache(pool_.get(), 3 * block);
  auto a = *pool_->Allocate(4);
  cache.Insert({H(1), H(2), H(3)}, {a[0], a[1], a[2]});
  ASSERT_TRUE(pool_->Release({a[0], a[1], a[2]}).ok());
  // Use H(1) so that H(2) becomes the least recently used.
  ASSERT_TRUE(pool_->Release(cache.Lookup({H(1)})).ok());
  cache.TakeEvents();
  // A fourth block over the 3-block cap evicts the least recently used: H(2).
  cache.Insert({H(4)}, {a[3]});
  EXPECT_EQ(cache.blocks(), 3);
  auto events = cache.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1].kind, KvCacheEvent::Kind::kEvicted);
  EXPECT_EQ(events[1].hash, H(2));
  EXPECT_EQ(pool_->ref_count(a[1]), 0);  // freed
  // H(4) is still referenced by its request: Evict skips it and takes H(3), then H(1).
  EXPECT_EQ(cache.Evict(5), 2);
  EXPECT_EQ(cache.blocks(), 1);
  EXPECT_EQ(pool_->ref_count(a[3]), 2);
  ASSERT_TRUE(pool_->Release({a[3]}).ok());
  EXPECT_EQ(cache.Evict(5), 1);
  EXPECT_EQ(pool_->num_free(), pool_->num_blocks());
}

TEST_F(PrefixCacheTest, DestructionReleasesEverythingAndCopyBlockCopies) {
  {
    PrefixCache cache(pool_.get(), 1 << 20);
    auto a = *pool_->Allocate(2);
    cache.Insert({H(1), H(2)}, a);
    ASSERT_TRUE(pool_->Release(a).ok());
  }
  EXPECT_EQ(pool_->num_free(), pool_->num_blocks());
  auto b = *pool_->Allocate(2);
  auto spans = *pool_->Spans(b);
  std::memset(spans[0].address, 0x5a, spans[0].length);
  ASSERT_TRUE(pool_->CopyBlock(b[0], b[1]).ok());
  EXPECT_EQ(0, std::memcmp(spans[0].address, spans[1].address, spans[0].length));
  EXPECT_FALSE(pool_->CopyBlock(b[0], 7).ok());  // not allocated
}

TEST_F(PrefixCacheTest, LookupAllIsAllOrNothingAndContainsTouchesNothing) {
  PrefixCache cache(pool_.get(), 1 << 20);
  auto blocks = *pool_->Allocate(3);
  cache.Insert({H(4), H(5), H(6)}, blocks);
  ASSERT_TRUE(pool_->Release(blocks).ok());
  EXPECT_TRUE(cache.Contains(H(5)));
  EXPECT_FALSE(cache.Contains(H(7)));
  // Blocks 5 and 6 (not a prefix of the chain): found, with references.
  auto found = cache.LookupAll({H(5), H(6)});
  ASSERT_EQ(found, std::vector<BlockId>({blocks[1], blocks[2]}));
  for (BlockId b : found) EXPECT_EQ(pool_->ref_count(b), 2);
  // One missing: nothing found, no reference taken.
  EXPECT_TRUE(cache.LookupAll({H(4), H(7)}).empty());
  EXPECT_EQ(pool_->ref_count(blocks[0]), 1);
  ASSERT_TRUE(pool_->Release(found).ok());
}

TEST_F(PrefixCacheTest, EventsAreBoundedAndACacheWithoutReportsRecordsNone) {
  // Offers one fresh block under `hash` and lets the request that computed it end.
  auto offer = [&](PrefixCache& cache, const Hash128& hash) {
    auto blocks = *pool_->Allocate(1);
    cache.Insert({hash}, blocks);
    ASSERT_TRUE(pool_->Release(blocks).ok());
  };
  PrefixCache quiet(pool_.get(), 1 << 20, /*record_events=*/false);
  offer(quiet, H(1));
  EXPECT_EQ(quiet.Evict(1), 1);
  EXPECT_TRUE(quiet.TakeEvents().empty());

  // Stored and evicted again and again with nobody taking the events: at most kMaxEvents kept,
  // the oldest dropped and counted.
  PrefixCache cache(pool_.get(), 1 << 20);
  const int64_t rounds = PrefixCache::kMaxEvents / 2 + 10;
  for (int64_t i = 0; i < rounds; ++i) {
    offer(cache, H(static_cast<uint64_t>(i) + 100));
    ASSERT_EQ(cache.Evict(1), 1);
  }
  EXPECT_EQ(cache.dropped_events(), 2 * rounds - static_cast<int64_t>(PrefixCache::kMaxEvents));
  const auto events = cache.TakeEvents();
  ASSERT_EQ(events.size(), PrefixCache::kMaxEvents);
  EXPECT_EQ(events.back().kind, KvCacheEvent::Kind::kEvicted);
  EXPECT_EQ(events.back().hash, H(static_cast<uint64_t>(rounds - 1) + 100));
  EXPECT_TRUE(cache.TakeEvents().empty());
  EXPECT_EQ(pool_->num_free(), pool_->num_blocks());
}

TEST_F(PrefixCacheTest, EntriesExpireATtlAfterTheirLastUseOnceUnreferenced) {
  FakeClock clock;
  PrefixCache cache(pool_.get(), 1 << 20);
  cache.SetTtl(absl::Seconds(180), &clock);
  auto blocks = *pool_->Allocate(3);
  cache.Insert({H(1), H(2), H(3)}, blocks);
  ASSERT_TRUE(pool_->Release({blocks[0], blocks[1]}).ok());  // blocks[2] stays in use
  clock.Advance(absl::Seconds(100));
  // A lookup is a use: H(1) lives on, H(2) does not.
  ASSERT_TRUE(pool_->Release(cache.LookupAll({H(1)})).ok());
  clock.Advance(absl::Seconds(80));
  EXPECT_EQ(cache.Expire(), 1);  // H(2): 180 s unused; H(3) is referenced, H(1) used at 100 s
  EXPECT_FALSE(cache.Contains(H(2)));
  EXPECT_TRUE(cache.Contains(H(1)) && cache.Contains(H(3)));
  EXPECT_EQ(pool_->ref_count(blocks[1]), 0);
  ASSERT_TRUE(pool_->Release({blocks[2]}).ok());
  clock.Advance(absl::Seconds(100));
  EXPECT_EQ(cache.Expire(), 2);  // H(1) at 280 s; H(3), unreferenced now, long unused
  EXPECT_EQ(cache.blocks(), 0);
  EXPECT_EQ(cache.expired(), 3);
  auto events = cache.TakeEvents();
  EXPECT_EQ(events.back().kind, KvCacheEvent::Kind::kEvicted);
  EXPECT_EQ(pool_->num_free(), pool_->num_blocks());

  // Without a TTL nothing expires.
  PrefixCache forever(pool_.get(), 1 << 20);
  auto b = *pool_->Allocate(1);
  forever.Insert({H(7)}, b);
  ASSERT_TRUE(pool_->Release(b).ok());
  clock.Advance(absl::Hours(1000));
  EXPECT_EQ(forever.Expire(), 0);
  EXPECT_TRUE(forever.Contains(H(7)));
}

}  // namespace
}  // namespace ferry
