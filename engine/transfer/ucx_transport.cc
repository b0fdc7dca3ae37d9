// Placeholder while the UCX implementation is written (replaced in this change).
#include "engine/transfer/ucx_transport.h"

namespace ferry {
namespace transfer {

absl::StatusOr<std::unique_ptr<KvTransport>> NewUcxTransport(const TransportOptions& options) {
  return absl::UnimplementedError("UCX transport not built yet");
}

}  // namespace transfer
}  // namespace ferry
