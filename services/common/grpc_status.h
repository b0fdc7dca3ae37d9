// absl::Status <-> grpc::Status. The two code spaces are numerically identical (both follow
// google.rpc.Code), so the mapping is exact and round-trips; messages are preserved.
//
// Use at the gRPC edge only: engine and store code return absl::Status.

#ifndef FERRY_SERVICES_COMMON_GRPC_STATUS_H_
#define FERRY_SERVICES_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ferry {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_GRPC_STATUS_H_
