#include "services/transfer/transfer_wire.h"

#include "absl/strings/str_cat.h"

namespace ferry {
namespace transfer {

v1::TransferDescriptor ToProto(const PeerDescriptor& descriptor) {
  v1::TransferDescriptor proto;
  proto.set_transport(descriptor.kind == "ucx"    ? v1::TRANSPORT_KIND_UCX
                      : descriptor.kind == "grpc" ? v1::TRANSPORT_KIND_GRPC
                                                  : v1::TRANSPORT_KIND_UNSPECIFIED);
  proto.set_worker_address(descriptor.address);
  for (const RegionDescriptor& region : descriptor.regions) {
    v1::MemoryRegion* r = proto.add_regions();
    r->set_base_address(region.address);
    r->set_length(region.length);
    r->set_remote_key(region.remote_key);
  }
  for (const BlockSlice& slice : descriptor.block_slices) {
    v1::MemorySlice* m = proto.add_block_slices();
    m->set_region_index(slice.region_index);
    m->set_offset(slice.offset);
    m->set_length(slice.length);
  }
  proto.set_transfer_id(descriptor.transfer_id);
  return proto;
}

absl::StatusOr<PeerDescriptor> FromProto(const v1::TransferDescriptor& proto) {
  PeerDescriptor descriptor;
  switch (proto.transport()) {
    case v1::TRANSPORT_KIND_UCX:
      descriptor.kind = "ucx";
      break;
    case v1::TRANSPORT_KIND_GRPC:
      descriptor.kind = "grpc";
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("transfer descriptor names an unknown transport (", proto.transport(), ")"));
  }
  if (proto.worker_address().empty()) {
    return absl::InvalidArgumentError("transfer descriptor has no address");
  }
  descriptor.address = proto.worker_address();
  for (int i = 0; i < proto.regions_size(); ++i) {
    const v1::MemoryRegion& r = proto.regions(i);
    if (r.remote_key().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer descriptor region ", i, " has no key"));
    }
    if (r.base_address() + r.length() < r.base_address()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer descriptor region ", i, " wraps around the address space"));
    }
    descriptor.regions.push_back({r.base_address(), r.length(), r.remote_key()});
  }
  for (int i = 0; i < proto.block_slices_size(); ++i) {
    const v1::MemorySlice& m = proto.block_slices(i);
    if (m.region_index() >= descriptor.regions.size()) {
      return absl::InvalidArgumentError(absl::StrCat("transfer descriptor block slice ", i,
                                                     " names region ", m.region_index(), " of ",
                                                     descriptor.regions.size()));
    }
    const RegionDescriptor& region = descriptor.regions[m.region_index()];
    if (m.length() == 0 || m.offset() > region.length || m.length() > region.length - m.offset()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer descriptor block slice ", i, " (", m.length(), " bytes at offset ",
                       m.offset(), ") does not fit its region of ", region.length, " bytes"));
    }
    descriptor.block_slices.push_back({m.region_index(), m.offset(), m.length()});
  }
  descriptor.transfer_id = proto.transfer_id();
  return descriptor;
}

absl::StatusOr<TransferRequest> BlockTransferRequest(const PeerDescriptor& remote,
                                                     size_t first_slice,
                                                     absl::Span<const MemorySpan> local,
                                                     TransferOp op) {
  if (local.empty()) return absl::InvalidArgumentError("no blocks to transfer");
  if (first_slice > remote.block_slices.size() ||
      local.size() > remote.block_slices.size() - first_slice) {
    return absl::InvalidArgumentError(absl::StrCat(local.size(), " blocks from slice ", first_slice,
                                                   " but the descriptor has ",
                                                   remote.block_slices.size(), " block slices"));
  }
  const uint32_t region_index = remote.block_slices[first_slice].region_index;
  if (region_index >= remote.regions.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block slice ", first_slice, " names a region the descriptor lacks"));
  }
  TransferRequest request;
  request.op = op;
  request.remote = remote.regions[region_index];
  request.transfer_id = remote.transfer_id;
  request.segments.reserve(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    const BlockSlice& slice = remote.block_slices[first_slice + i];
    if (slice.region_index != region_index) {
      return absl::InvalidArgumentError(
          absl::StrCat("block slices ", first_slice, "..", first_slice + local.size() - 1,
                       " span more than one region; one transfer names one remote region"));
    }
    if (slice.length != local[i].length) {
      return absl::InvalidArgumentError(absl::StrCat("block ", i, " is ", local[i].length,
                                                     " bytes but its slice is ", slice.length));
    }
    if (slice.offset > request.remote.length ||
        slice.length > request.remote.length - slice.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("block slice ", first_slice + i, " lies outside its region"));
    }
    request.segments.push_back({reinterpret_cast<uint64_t>(local[i].address),
                                request.remote.address + slice.offset, slice.length});
  }
  return request;
}

}  // namespace transfer
}  // namespace ferry
