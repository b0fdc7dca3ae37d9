// DevicePool's accounting (device_pool.h), on host memory: alignment, best fit, merging of free
// neighbours, the limit, slabs of their own for large pieces, Trim, and nothing lost over a
// random sequence of allocations and frees.

#include "engine/backends/cuda/device_pool.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ferry::cuda {
namespace {

// Host memory as the slab source, counting what is outstanding.
struct HostSource {
  std::map<void*, size_t> live;
  int reserves = 0;
  DevicePool::Source Make() {
    DevicePool::Source s;
    s.reserve = [this](size_t bytes) -> void* {
      void* p = std::aligned_alloc(kDeviceAlignment, bytes);
      if (p != nullptr) live[p] = bytes;
      ++reserves;
      return p;
    };
    s.release = [this](void* p, size_t bytes) {
      EXPECT_EQ(live[p], bytes);
      live.erase(p);
      std::free(p);
    };
    return s;
  }
};

TEST(DevicePoolTest, AlignsAndReusesFreedPieces) {
  HostSource host;
  DevicePool pool(host.Make(), 1 << 16, 1 << 20);
  void* a = pool.Allocate(10);
  void* b = pool.Allocate(300);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kDeviceAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kDeviceAlignment, 0u);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), 256);
  EXPECT_EQ(pool.stats().in_use_bytes, 256u + 512u);
  pool.Free(a);
  EXPECT_EQ(pool.Allocate(200), a);  // the hole a left is the best fit
  EXPECT_EQ(host.reserves, 1);
}

TEST(DevicePoolTest, MergesNeighboursSoALargePieceFitsAgain) {
  HostSource host;
  DevicePool pool(host.Make(), 4096, 4096);
  std::vector<void*> pieces;
  for (int i = 0; i < 16; ++i) pieces.push_back(pool.Allocate(256));
  EXPECT_EQ(pool.Allocate(1), nullptr);  // the slab is full and the limit allows no other
  // Free in an order that needs both forward and backward merges.
  for (int i : {1, 3, 2, 0, 5, 4, 15, 6, 8, 7, 10, 9, 12, 11, 14, 13}) pool.Free(pieces[i]);
  EXPECT_EQ(pool.stats().in_use_bytes, 0u);
  EXPECT_EQ(pool.Allocate(4096), pieces[0]);
}

TEST(DevicePoolTest, KeepsToItsLimitAndGivesLargePiecesTheirOwnSlab) {
  HostSource host;
  DevicePool pool(host.Make(), 1 << 12, 1 << 14);
  void* big = pool.Allocate(3 << 12);  // larger than a slab: a slab of its own
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(pool.stats().reserved_bytes, 3u << 12);
  void* small = pool.Allocate(100);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(pool.stats().slabs, 2u);
  EXPECT_EQ(pool.Allocate(1 << 12), nullptr);  // a third slab would pass the limit
  pool.Free(big);
  pool.Trim();
  EXPECT_EQ(pool.stats().slabs, 1u);
  EXPECT_EQ(pool.stats().reserved_bytes, 1u << 12);
  EXPECT_NE(pool.Allocate(2 << 12), nullptr);  // the room Trim gave back
  pool.Free(small);
}

TEST(DevicePoolTest, NearTheLimitASlabIsWhatIsLeft) {
  HostSource host;
  DevicePool pool(host.Make(), 8192, 12288);
  void* a = pool.Allocate(8192);
  ASSERT_NE(a, nullptr);
  void* b = pool.Allocate(1000);  // an ordinary slab would pass the limit; the 4096 left do
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool.stats().reserved_bytes, 12288u);
  EXPECT_EQ(pool.Allocate(4000), nullptr);  // 3072 left in the small slab, none beyond
  pool.Free(a);
  pool.Free(b);
}

TEST(DevicePoolTest, RandomTrafficLosesNothing) {
  HostSource host;
  {
    DevicePool pool(host.Make(), 1 << 16, 1 << 22);
    std::mt19937 rng(3);
    std::map<void*, size_t> held;
    for (int step = 0; step < 5000; ++step) {
      if (held.empty() || rng() % 3 != 0) {
        const size_t bytes = 1 + rng() % 20000;
        void* p = pool.Allocate(bytes);
        if (p == nullptr) continue;
        // No overlap with any piece held.
        auto next = held.lower_bound(p);
        if (next != held.end()) {
          ASSERT_LE(static_cast<char*>(p) + bytes, static_cast<char*>(next->first));
        }
        if (next != held.begin()) {
          auto prev = std::prev(next);
          ASSERT_LE(static_cast<char*>(prev->first) + prev->second, static_cast<char*>(p));
        }
        held[p] = bytes;
      } else {
        auto it = held.begin();
        std::advance(it, rng() % held.size());
        pool.Free(it->first);
        held.erase(it);
      }
    }
    for (const auto& [p, bytes] : held) pool.Free(p);
    const DevicePool::Stats s = pool.stats();
    EXPECT_EQ(s.in_use_bytes, 0u);
    EXPECT_EQ(s.pieces, 0u);
    EXPECT_GT(s.peak_in_use_bytes, 0u);
  }
  EXPECT_TRUE(host.live.empty());  // the destructor gave every slab back
}

}  // namespace
}  // namespace ferry::cuda
