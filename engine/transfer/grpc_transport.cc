// Placeholder while the gRPC implementation is written (replaced in this change).
#include "engine/transfer/grpc_transport.h"

namespace ferry {
namespace transfer {

absl::StatusOr<std::unique_ptr<KvTransport>> NewGrpcTransport(const TransportOptions& options) {
  return absl::UnimplementedError("gRPC transport not built yet");
}

}  // namespace transfer
}  // namespace ferry
