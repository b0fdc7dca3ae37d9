#include "services/worker/kv_handoff.h"

#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/model_fingerprint.h"
#include "gtest/gtest.h"
#include "services/transfer/transfer_wire.h"

namespace ferry {
namespace {

class KvHandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = *CpuBackend::Create({1, std::nullopt});
    KvBlockLayout layout;
    layout.num_layers = 2;
    layout.num_kv_heads = 2;
    layout.head_dim = 8;
    layout.block_tokens = 4;
    layout.dtype = DType::kBF16;
    allocator_ = std::make_unique<BackendKvAllocator>(backend_.get());
    pool_ = *KvBlockPool::Create(layout, 8, allocator_.get(), backend_.get());
    table_ = *pool_->Allocate(5);
    block_ = pool_->layout().block_bytes();
    // D holds the first 2 blocks; its 3 reserved slices lie in its region out of order.
    transfer::PeerDescriptor d;
    d.kind = "ucx";
    d.address = "decode";
    d.regions.push_back({kRemoteBase, 16 * block_, "key"});
    for (uint64_t slot : {5, 1, 3}) d.block_slices.push_back({0, slot * block_, block_});
    d.transfer_id = "t-1";
    reservation_.set_cached_prefix_blocks(2);
    reservation_.set_reserved_blocks(3);
    *reservation_.mutable_transfer() = transfer::ToProto(d);
    reservation_.set_deadline_unix_ms(absl::ToUnixMillis(absl::Now() + absl::Seconds(5)));
  }
  uint64_t Local(int index) const {
    return reinterpret_cast<uint64_t>((*pool_->Spans({table_[index]}))[0].address);
  }

  static constexpr uint64_t kRemoteBase = 0x100000;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<BackendKvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_;
  std::vector<BlockId> table_;
  uint64_t block_ = 0;
  v1::KvReservation reservation_;
};

TEST_F(KvHandoffTest, AStreamedPutGoesToItsBlocksSlicesAndNamesNoTransfer) {
  uint64_t bytes = 0;
  auto put = StreamTransfer(reservation_, 2, {table_[2], table_[3]}, *pool_, absl::InfiniteFuture(),
                            &bytes);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_TRUE(put->transfer_id.empty()) << "D learns of it only through the last puts";
  EXPECT_EQ(put->deadline, absl::FromUnixMillis(reservation_.deadline_unix_ms()));
  ASSERT_EQ(put->segments.size(), 2u);
  EXPECT_EQ(put->segments[0].local_address, Local(2));
  EXPECT_EQ(put->segments[0].remote_address, kRemoteBase + 5 * block_);
  EXPECT_EQ(put->segments[1].local_address, Local(3));
  EXPECT_EQ(put->segments[1].remote_address, kRemoteBase + 1 * block_);
  EXPECT_EQ(bytes, 2 * block_);
  // Blocks D holds, or beyond the table, are refused.
  EXPECT_EQ(StreamTransfer(reservation_, 1, {table_[1]}, *pool_, absl::InfiniteFuture(), &bytes)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StreamTransfer(reservation_, 4, {table_[4], table_[0]}, *pool_, absl::InfiniteFuture(),
                           &bytes)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(KvHandoffTest, APrecopyPutsTheHeldBlocksPastTheCachedPrefixAndNamesTheTransfer) {
  KvFacts facts;
  facts.block_tokens = 4;
  facts.block_bytes = block_;
  v1::KvReservation r = reservation_;
  r.set_block_tokens(4);
  r.set_block_bytes(block_);
  r.set_kv_format_version(kKvFormatVersion);
  ASSERT_TRUE(CheckPrecopyReservation(r, facts).ok()) << CheckPrecopyReservation(r, facts);
  uint64_t bytes = 0;
  // The source holds the table's first 5 blocks; D has 2 of them cached: 3 go, in slice order.
  auto put = PrecopyTransfer(r, table_, *pool_, absl::InfiniteFuture(), &bytes);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->transfer_id, "t-1");
  ASSERT_EQ(put->segments.size(), 3u);
  EXPECT_EQ(put->segments[0].local_address, Local(2));
  EXPECT_EQ(put->segments[0].remote_address, kRemoteBase + 5 * block_);
  EXPECT_EQ(put->segments[2].local_address, Local(4));
  EXPECT_EQ(put->segments[2].remote_address, kRemoteBase + 3 * block_);
  EXPECT_EQ(bytes, 3 * block_);
  // Held blocks that do not match the reservation, another layout, no slices or no id: refused.
  EXPECT_EQ(PrecopyTransfer(r, {table_[0], table_[1]}, *pool_, absl::InfiniteFuture(), &bytes)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  KvFacts other = facts;
  other.block_bytes = 2 * block_;
  EXPECT_EQ(CheckPrecopyReservation(r, other).code(), absl::StatusCode::kFailedPrecondition);
  v1::KvReservation no_slices = r;
  no_slices.mutable_transfer()->clear_block_slices();
  EXPECT_EQ(CheckPrecopyReservation(no_slices, facts).code(), absl::StatusCode::kInvalidArgument);
  v1::KvReservation no_id = r;
  no_id.mutable_transfer()->clear_transfer_id();
  EXPECT_EQ(CheckPrecopyReservation(no_id, facts).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(KvHandoffTest, TheLastPutsTakeTheRestAndNameTheTransfer) {
  uint64_t bytes = 0;
  // Blocks 2 and 3 were streamed: the rest is block 4, into the third slice.
  auto puts = PushTransfers(reservation_, table_, {}, *pool_, nullptr, 4, 0, absl::InfiniteFuture(),
                            &bytes);
  ASSERT_TRUE(puts.ok()) << puts.status();
  ASSERT_EQ(puts->size(), 1u);
  EXPECT_EQ((*puts)[0].transfer_id, "t-1");
  ASSERT_EQ((*puts)[0].segments.size(), 1u);
  EXPECT_EQ((*puts)[0].segments[0].local_address, Local(4));
  EXPECT_EQ((*puts)[0].segments[0].remote_address, kRemoteBase + 3 * block_);
  EXPECT_EQ(bytes, block_);
  // Nothing streamed: every block D lacks (from_block before them counts from them).
  puts = PushTransfers(reservation_, table_, {}, *pool_, nullptr, 0, 0, absl::InfiniteFuture(),
                       &bytes);
  ASSERT_TRUE(puts.ok()) << puts.status();
  ASSERT_EQ((*puts)[0].segments.size(), 3u);
  EXPECT_EQ((*puts)[0].segments[0].local_address, Local(2));
  EXPECT_EQ(bytes, 3 * block_);
  // Everything streamed would leave no put to name the transfer: refused.
  EXPECT_EQ(
      PushTransfers(reservation_, table_, {}, *pool_, nullptr, 5, 0, absl::InfiniteFuture(), &bytes)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
