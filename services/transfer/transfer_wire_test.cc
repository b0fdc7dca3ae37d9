#include "services/transfer/transfer_wire.h"

#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace transfer {
namespace {

PeerDescriptor TwoRegions() {
  PeerDescriptor d;
  d.kind = "ucx";
  d.address = "addr";
  d.regions = {{0x10000, 4096, "key-a"}, {0x90000, 8192, "key-b"}};
  // Blocks of 1024 bytes: three in region 1 (not in order), one in region 0.
  d.block_slices = {{1, 2048, 1024}, {1, 0, 1024}, {1, 5120, 1024}, {0, 1024, 1024}};
  d.transfer_id = "req-1";
  return d;
}

TEST(TransferWireTest, DescriptorRoundTripsThroughProto) {
  const PeerDescriptor d = TwoRegions();
  absl::StatusOr<PeerDescriptor> back = FromProto(ToProto(d));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, "ucx");
  EXPECT_EQ(back->address, "addr");
  ASSERT_EQ(back->regions.size(), 2u);
  EXPECT_EQ(back->regions[1].address, 0x90000u);
  EXPECT_EQ(back->regions[1].length, 8192u);
  EXPECT_EQ(back->regions[1].remote_key, "key-b");
  ASSERT_EQ(back->block_slices.size(), 4u);
  EXPECT_EQ(back->block_slices[2].offset, 5120u);
  EXPECT_EQ(back->block_slices[3].region_index, 0u);
  EXPECT_EQ(back->transfer_id, "req-1");
}

TEST(TransferWireTest, FromProtoRefusesSlicesOutsideTheirRegion) {
  PeerDescriptor d = TwoRegions();
  d.block_slices.push_back({2, 0, 16});  // no region 2
  EXPECT_EQ(FromProto(ToProto(d)).status().code(), absl::StatusCode::kInvalidArgument);
  d.block_slices.back() = {0, 4000, 200};  // past the end of region 0
  EXPECT_EQ(FromProto(ToProto(d)).status().code(), absl::StatusCode::kInvalidArgument);
  d.block_slices.back() = {0, 0, 0};  // empty
  EXPECT_EQ(FromProto(ToProto(d)).status().code(), absl::StatusCode::kInvalidArgument);
  v1::TransferDescriptor proto = ToProto(TwoRegions());
  proto.set_transport(v1::TRANSPORT_KIND_UNSPECIFIED);
  EXPECT_EQ(FromProto(proto).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransferWireTest, BlockTransferRequestMapsBlocksToSlices) {
  std::vector<char> pool(3 * 1024);
  const std::vector<MemorySpan> local = {
      {pool.data() + 2048, 1024}, {pool.data(), 1024}, {pool.data() + 1024, 1024}};
  absl::StatusOr<TransferRequest> r =
      BlockTransferRequest(TwoRegions(), 0, local, TransferOp::kPut);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->op, TransferOp::kPut);
  EXPECT_EQ(r->remote.remote_key, "key-b");
  EXPECT_EQ(r->transfer_id, "req-1");
  ASSERT_EQ(r->segments.size(), 3u);
  EXPECT_EQ(r->segments[0].local_address, reinterpret_cast<uint64_t>(pool.data() + 2048));
  EXPECT_EQ(r->segments[0].remote_address, 0x90000u + 2048);
  EXPECT_EQ(r->segments[1].remote_address, 0x90000u);
  EXPECT_EQ(r->segments[2].remote_address, 0x90000u + 5120);
  EXPECT_EQ(r->segments[2].length, 1024u);
  // What the transport checks before posting holds for the mapped request (given a deadline).
  r->deadline = absl::Now() + absl::Seconds(1);
  EXPECT_TRUE(ValidateTransferRequest(*r).ok());
  // The last block alone, in region 0.
  absl::StatusOr<TransferRequest> last =
      BlockTransferRequest(TwoRegions(), 3, {local[0]}, TransferOp::kGet);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->remote.remote_key, "key-a");
  EXPECT_EQ(last->segments[0].remote_address, 0x10000u + 1024);
}

TEST(TransferWireTest, BlockTransferRequestRefusesMismatches) {
  std::vector<char> pool(4 * 1024);
  const MemorySpan block = {pool.data(), 1024};
  // Slices 2..3 span regions 1 and 0.
  EXPECT_EQ(BlockTransferRequest(TwoRegions(), 2, {block, block}, TransferOp::kPut).status().code(),
            absl::StatusCode::kInvalidArgument);
  // More blocks than slices.
  EXPECT_EQ(BlockTransferRequest(TwoRegions(), 3, {block, block}, TransferOp::kPut).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A block whose size differs from its slice.
  EXPECT_EQ(
      BlockTransferRequest(TwoRegions(), 0, {{pool.data(), 512}}, TransferOp::kPut).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockTransferRequest(TwoRegions(), 0, {}, TransferOp::kPut).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace transfer
}  // namespace ferry
