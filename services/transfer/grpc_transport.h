// The gRPC streaming implementation of KvTransport, the fallback where UCX is unavailable. Use
// KvTransport::Create with kind "grpc"; this header is for the factory.
//
// The transport runs its own gRPC server (ferry.v1.KvTransfer, proto/ferry/v1/transfer.proto)
// on TransportOptions::listen_address; address() is its "host:port". A region's remote key is
// an unguessable token naming the region: the server writes or reads only inside a region whose
// token the caller presents. Puts stream the local bytes in chunks of grpc_chunk_bytes on one
// Write call per transfer; gets are one Read call whose chunks are copied into local memory.
// Deadlines are the calls' gRPC deadlines; Cancel cancels the call. With TransportOptions::
// auth_token, the server refuses every call without that shared token (UNAUTHENTICATED) before it
// looks at a region key, and the transport's own calls carry it.

#ifndef FERRY_SERVICES_TRANSFER_GRPC_TRANSPORT_H_
#define FERRY_SERVICES_TRANSFER_GRPC_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "services/transfer/kv_transport.h"

namespace ferry {
namespace transfer {

absl::StatusOr<std::unique_ptr<KvTransport>> NewGrpcTransport(const TransportOptions& options);

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_GRPC_TRANSPORT_H_
