// KV transport descriptors <-> ferry.v1.TransferDescriptor (proto/ferry/v1/common.proto): what a
// process sends a peer so that the peer can connect and move bytes in or out of its memory.

#ifndef FERRY_ENGINE_TRANSFER_TRANSFER_WIRE_H_
#define FERRY_ENGINE_TRANSFER_TRANSFER_WIRE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/transfer/kv_transport.h"
#include "ferry/v1/common.pb.h"

namespace ferry {
namespace transfer {

struct PeerDescriptor {
  std::string kind;     // KvTransport::kind(): "ucx" or "grpc"
  std::string address;  // KvTransport::address(), for Connect
  std::vector<RegionDescriptor> regions;
  std::string transfer_id;
};

v1::TransferDescriptor ToProto(const PeerDescriptor& descriptor);
// InvalidArgument for an unknown transport, an empty address, a region without a key or one
// that wraps around the address space.
absl::StatusOr<PeerDescriptor> FromProto(const v1::TransferDescriptor& proto);

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_ENGINE_TRANSFER_TRANSFER_WIRE_H_
