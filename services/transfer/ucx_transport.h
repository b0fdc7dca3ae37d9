// The UCX implementation of KvTransport (ucp, one-sided RMA). Use KvTransport::Create with
// kind "ucx"; this header is for the factory.
//
// One thread owns the ucp_worker: every UCX call (registration, connection, puts and gets,
// flushes, active messages, progress) runs on it; other threads hand it commands through a queue
// and wake it with ucp_worker_signal. It polls while there is work (over tcp a put only moves as
// the receiving worker progresses, so every process runs its thread) and sleeps on the worker's
// event fd when idle.
//
// Endpoints use peer error handling (UCP_ERR_HANDLING_MODE_PEER) where the transports have it: a
// dead peer fails its operations instead of leaving them pending. UCX 1.13's shared-memory
// transports do not: a peer on the same host is then watched through a pidfd (the address carries
// the process's identity) and deadlines bound the rest.
//
// Where UCX has native RMA to the peer (shared memory, RDMA), a transfer posts its segments as
// ucp puts/gets (at most kMaxInflightOps at a time), flushes the endpoint after puts (so success
// means the bytes are in the peer's memory), then, with a transfer_id, sends the owner an active
// message with the outcome. Where it has not (tcp), UCX 1.13 emulates RMA in software and aborts a
// target whose initiator dies mid-put, so the data travels as Ferry's own active messages instead
// (see "The active-message protocol" in ucx_am_protocol.cc); a put of 64 KiB or more sends its
// data and commit on a TCP connection of its own instead, which the owner reads straight into the
// destination (ucx_data_socket.h: one copy where UCX's tcp transport makes two). The target answers
// (acknowledgements, the data of gets) over its own connection to the initiator, which it makes and
// uses only once ucp_worker_progress has returned, never from inside the message's callback: an
// endpoint created there can crash UCX 1.13's tcp transport. The transports UCX chose for a peer
// are logged at connection and are the metrics' transport label ("ucx:tcp").

#ifndef FERRY_SERVICES_TRANSFER_UCX_TRANSPORT_H_
#define FERRY_SERVICES_TRANSFER_UCX_TRANSPORT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "services/transfer/kv_transport.h"

namespace ferry {
namespace transfer {

absl::StatusOr<std::unique_ptr<KvTransport>> NewUcxTransport(const TransportOptions& options);

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_UCX_TRANSPORT_H_
