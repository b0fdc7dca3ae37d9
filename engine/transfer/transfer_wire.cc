#include "engine/transfer/transfer_wire.h"

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
  descriptor.transfer_id = proto.transfer_id();
  return descriptor;
}

}  // namespace transfer
}  // namespace ferry
