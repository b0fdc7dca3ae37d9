#include "absl/strings/str_cat.h"
#include "services/transfer/grpc_transport.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/ucx_transport.h"

namespace ferry {
namespace transfer {

absl::StatusOr<std::unique_ptr<KvTransport>> KvTransport::Create(const TransportOptions& options) {
  if (options.kind == "ucx") return NewUcxTransport(options);
  if (options.kind == "grpc") return NewGrpcTransport(options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV transport '", options.kind, "'; use 'ucx' or 'grpc'"));
}

}  // namespace transfer
}  // namespace ferry
