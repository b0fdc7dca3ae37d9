// The UCX implementation of KvTransport (ucp, one-sided RMA). Use KvTransport::Create with
// kind "ucx"; this header is for the factory.
//
// One thread owns the ucp_worker: every UCX call (registration, connection, puts and gets,
// flushes, active messages, progress) runs on it; other threads hand it commands through a queue
// and wake it with ucp_worker_signal. It polls while there is work (over tcp a put only moves as
// the receiving worker progresses, so every process runs its thread) and sleeps on the worker's
// event fd when idle.
//
// Endpoints use peer error handling (UCP_ERR_HANDLING_MODE_PEER): a dead peer fails its
// operations instead of leaving them pending. A transfer posts its segments (at most
// kMaxInflightOps / kMaxInflightBytes at a time), flushes the endpoint after puts (so that
// success means the bytes are in the peer's memory), then, with a transfer_id, sends the peer an
// active message with the outcome. The transports UCX chose for a peer (its endpoint's lanes)
// are logged at connection and are the metrics' transport label ("ucx:tcp").

#ifndef FERRY_ENGINE_TRANSFER_UCX_TRANSPORT_H_
#define FERRY_ENGINE_TRANSFER_UCX_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "engine/transfer/kv_transport.h"

namespace ferry {
namespace transfer {

absl::StatusOr<std::unique_ptr<KvTransport>> NewUcxTransport(const TransportOptions& options);

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_ENGINE_TRANSFER_UCX_TRANSPORT_H_
