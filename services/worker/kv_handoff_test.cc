#include "services/worker/kv_handoff.h"

#include <cstring>
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
    staging_ = *KvStaging::InPlace(pool_.get());
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
  std::unique_ptr<KvStaging> staging_;
  std::shared_ptr<KvHostBlocks> source_;
  std::vector<std::shared_ptr<KvHostBlocks>> sources_;
  std::vector<BlockId> table_;
  uint64_t block_ = 0;
  v1::KvReservation reservation_;
};

TEST_F(KvHandoffTest, AStreamedPutGoesToItsBlocksSlicesAndNamesNoTransfer) {
  uint64_t bytes = 0;
  auto put = StreamTransfer(reservation_, 2, {table_[2], table_[3]}, *staging_,
                            absl::InfiniteFuture(), &bytes, &source_);
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
  EXPECT_EQ(StreamTransfer(reservation_, 1, {table_[1]}, *staging_, absl::InfiniteFuture(), &bytes,
                           &source_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(StreamTransfer(reservation_, 4, {table_[4], table_[0]}, *staging_,
                           absl::InfiniteFuture(), &bytes, &source_)
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
  auto put = PrecopyTransfer(r, table_, *staging_, absl::InfiniteFuture(), &bytes, &source_);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->transfer_id, "t-1");
  ASSERT_EQ(put->segments.size(), 3u);
  EXPECT_EQ(put->segments[0].local_address, Local(2));
  EXPECT_EQ(put->segments[0].remote_address, kRemoteBase + 5 * block_);
  EXPECT_EQ(put->segments[2].local_address, Local(4));
  EXPECT_EQ(put->segments[2].remote_address, kRemoteBase + 3 * block_);
  EXPECT_EQ(bytes, 3 * block_);
  // Held blocks that do not match the reservation, another layout, no slices or no id: refused.
  EXPECT_EQ(PrecopyTransfer(r, {table_[0], table_[1]}, *staging_, absl::InfiniteFuture(), &bytes,
                            &source_)
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
  auto puts = PushTransfers(reservation_, table_, {}, *staging_, nullptr, 4, 0,
                            absl::InfiniteFuture(), &bytes, &sources_);
  ASSERT_TRUE(puts.ok()) << puts.status();
  ASSERT_EQ(puts->size(), 1u);
  EXPECT_EQ((*puts)[0].transfer_id, "t-1");
  ASSERT_EQ((*puts)[0].segments.size(), 1u);
  EXPECT_EQ((*puts)[0].segments[0].local_address, Local(4));
  EXPECT_EQ((*puts)[0].segments[0].remote_address, kRemoteBase + 3 * block_);
  EXPECT_EQ(bytes, block_);
  // Nothing streamed: every block D lacks (from_block before them counts from them).
  puts = PushTransfers(reservation_, table_, {}, *staging_, nullptr, 0, 0, absl::InfiniteFuture(),
                       &bytes, &sources_);
  ASSERT_TRUE(puts.ok()) << puts.status();
  ASSERT_EQ((*puts)[0].segments.size(), 3u);
  EXPECT_EQ((*puts)[0].segments[0].local_address, Local(2));
  EXPECT_EQ(bytes, 3 * block_);
  // Everything streamed would leave no put to name the transfer: refused.
  EXPECT_EQ(PushTransfers(reservation_, table_, {}, *staging_, nullptr, 5, 0,
                          absl::InfiniteFuture(), &bytes, &sources_)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// A GPU's pool (here: the CPU's, staged as one): the puts read the staging area, which holds the
// blocks' bytes until the caller lets go of the source; a reservation names staging slots, which
// a landing commits into the blocks.
TEST_F(KvHandoffTest, StagedPutsReadAndReservationsNameTheStagingArea) {
  HostKvAllocator host;
  auto staged = KvStaging::Staged(pool_.get(), &host, 4);
  ASSERT_TRUE(staged.ok()) << staged.status();
  std::vector<char> bytes_in(5 * block_);
  for (size_t i = 0; i < bytes_in.size(); ++i) bytes_in[i] = static_cast<char>(i * 7 + i / block_);
  ASSERT_TRUE(pool_->Import(table_, bytes_in.data(), bytes_in.size()).ok());
  uint64_t bytes = 0;
  auto puts = PushTransfers(reservation_, table_, {}, **staged, nullptr, 0, 0,
                            absl::InfiniteFuture(), &bytes, &sources_);
  ASSERT_TRUE(puts.ok()) << puts.status();
  ASSERT_EQ(sources_.size(), 1u);
  EXPECT_EQ((*staged)->free_slots(), 1);
  const auto base = reinterpret_cast<uint64_t>((*staged)->region().address);
  ASSERT_EQ((*puts)[0].segments.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const transfer::TransferSegment& seg = (*puts)[0].segments[i];
    EXPECT_GE(seg.local_address, base);
    EXPECT_LT(seg.local_address, base + (*staged)->region().length);
    EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(seg.local_address),
                          bytes_in.data() + (2 + i) * block_, block_),
              0)
        << i;
  }
  // More than the area has free: refused at once, and nothing held.
  EXPECT_EQ(
      PrecopyTransfer(reservation_, table_, **staged, absl::InfiniteFuture(), &bytes, &source_)
          .status()
          .code(),
      absl::StatusCode::kResourceExhausted);
  sources_.clear();
  EXPECT_EQ((*staged)->free_slots(), 4);

  // The decode side: slices in the staging area's region, committed into the blocks on landing.
  transfer::TransportOptions grpc;
  grpc.kind = "grpc";
  auto transport = transfer::KvTransport::Create(grpc);
  ASSERT_TRUE(transport.ok()) << transport.status();
  ReservationTarget target;
  target.transport = transport->get();
  target.pool_region = {base, (*staged)->region().length, "key"};
  target.staging = staged->get();
  KvFacts facts;
  facts.block_tokens = 4;
  facts.block_bytes = block_;
  KvReservation blocks;
  blocks.blocks = table_;
  blocks.cached_blocks = 2;
  KvLanding landing;
  auto described = DescribeReservation("r", blocks, target, facts, "t", "",
                                       absl::Now() + absl::Seconds(5), &landing);
  ASSERT_TRUE(described.ok()) << described.status();
  ASSERT_EQ(landing.size(), 1u);
  ASSERT_EQ(described->transfer().block_slices_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(base + described->transfer().block_slices(i).offset(),
              reinterpret_cast<uint64_t>(landing[0]->spans()[i].address));
    std::memset(landing[0]->spans()[i].address, 40 + i, block_);
  }
  ASSERT_TRUE(landing[0]->Commit().ok());
  std::vector<char> out(block_);
  ASSERT_TRUE(pool_->ExportToHost({table_[3]}, out.data(), out.size()).ok());
  EXPECT_EQ(out, std::vector<char>(block_, 41));
  landing.clear();
  EXPECT_EQ((*staged)->free_slots(), 4);
}

}  // namespace
}  // namespace ferry
