// KV transport descriptors <-> ferry.v1.TransferDescriptor (proto/ferry/v1/common.proto): what a
// process sends a peer so that the peer can connect and move bytes in or out of its memory.

#ifndef FERRY_SERVICES_TRANSFER_TRANSFER_WIRE_H_
#define FERRY_SERVICES_TRANSFER_TRANSFER_WIRE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ferry/v1/common.pb.h"
#include "services/transfer/kv_transport.h"

namespace ferry {
namespace transfer {

// One block's bytes in the peer's memory: `length` bytes at `offset` into regions[region_index].
struct BlockSlice {
  uint32_t region_index = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct PeerDescriptor {
  std::string kind;     // KvTransport::kind(): "ucx" or "grpc"
  std::string address;  // KvTransport::address(), for Connect
  std::vector<RegionDescriptor> regions;
  // One per block, in block order (ferry.v1.TransferDescriptor.block_slices).
  std::vector<BlockSlice> block_slices;
  std::string transfer_id;
};

v1::TransferDescriptor ToProto(const PeerDescriptor& descriptor);
// InvalidArgument for an unknown transport, an empty address, a region without a key or one
// that wraps around the address space.
absl::StatusOr<PeerDescriptor> FromProto(const v1::TransferDescriptor& proto);

// The transfer that moves a run of local blocks (`local`, one span per block: what
// KvBlockPool::Spans returns) to (kPut) or from (kGet) the peer's block slices
// [first_slice, first_slice + local.size()), with the descriptor's transfer_id. InvalidArgument
// if the slices run out, a slice's length differs from its block's, a slice lies outside its
// region, or the slices span more than one region (one transfer names one remote region). The
// caller sets `peer` and `deadline`.
absl::StatusOr<TransferRequest> BlockTransferRequest(const PeerDescriptor& remote,
                                                     size_t first_slice,
                                                     absl::Span<const MemorySpan> local,
                                                     TransferOp op);

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_TRANSFER_WIRE_H_
