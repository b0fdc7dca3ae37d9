// A remote UCX transport as this one sees it: Peer, the progress thread's state for one
// connection (its endpoint, the remote keys unpacked for it, the transfers on it, how the endpoint
// closes), and PeerInfo, what other threads read of it. Also what a connection is made from: this
// process's identity (carried in its address, ucx_wire.h) and a process's start time, with which
// a peer on this host is watched for its exit. UcxTransport (ucx_transport_internal.h) owns its
// peers; ucx_peer.cc defines its connection methods: Connect and Disconnect, the remote keys,
// failure, closing and reaping, and the reply connections of the active-message protocol.
//
// Internal to the ucx_transport library. Threading: as marked on each struct; a Peer's transfers
// are owned by the transport, not the peer. SelfIdentity, ProcessStartTime and ProcessGoneOrDying
// read /proc and do not fail: what they cannot read is left empty or 0.

#ifndef FERRY_SERVICES_TRANSFER_UCX_PEER_H_
#define FERRY_SERVICES_TRANSFER_UCX_PEER_H_

#include <ucp/api/ucp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/ucx_data_socket.h"
#include "services/transfer/ucx_wire.h"

// Hidden visibility: nothing here is used outside the ucx_transport library (as when all of it
// was one file, with internal linkage).
#pragma GCC visibility push(hidden)

namespace ferry {
namespace transfer {
namespace ucx_internal {

struct Transfer;  // ucx_transport_internal.h

// Progress thread only, except `label` and `failed` (also under peers_mu_ in PeerInfo).
struct Peer {
  PeerId id = 0;
  ucp_ep_h ep = nullptr;
  std::string label;
  bool failed = false;
  absl::Status failure;
  // Unpacked remote keys, with the ticket of their mapping's population (0: none).
  std::map<std::string, std::pair<ucp_rkey_h, uint64_t>> rkeys;
  std::set<Transfer*> transfers;
  // A close in progress (null when done or not started).
  void* close_request = nullptr;
  bool closed = false;
  absl::Time closed_at = absl::InfinitePast();
  // Failed, to be closed gracefully once nothing is in flight, or forcibly at close_force_at.
  bool close_pending = false;
  absl::Time close_force_at = absl::InfiniteFuture();
  // A pidfd of the peer's process when it runs on this host, else -1.
  int pidfd = -1;
  // No native RMA to this peer: transfers use Ferry's active-message protocol.
  bool am_mode = false;
  // The peer's bulk-data listener (port 0: none) and whether it is on this host.
  DataEndpoint data_endpoint;
  bool same_host = false;
  // The bulk-data connection of puts to the peer (am_mode), made on the first; aborted when the
  // peer fails.
  std::unique_ptr<DataSender> data;
};

struct PeerInfo {
  std::string address;
  std::string label;
  bool failed = false;
  // The peer answered the handshake (Connect), or this is a reply connection (the peer's own
  // handshake made it): the wireup of both directions is complete.
  bool ready = false;
};

// Field 22 (starttime) of /proc/<pid>/stat; 0 if the process does not exist.
uint64_t ProcessStartTime(uint32_t pid);
// True once a process on this host is past the point of answering a connection: it has exited
// (its pidfd readable, or a zombie), is exiting (PF_EXITING), or has SIGKILL pending. Its
// listening sockets may already be closed though its pid still resolves, and a UCX 1.13 tcp
// endpoint whose connection is refused while its wireup request is still queued aborts the whole
// process (ucp_request.c: "Assertion ... got REQUEST message", fixed upstream in UCX 1.14).
bool ProcessGoneOrDying(uint32_t pid, int pidfd);
// This process's identity, for its address.
ProcessIdentity SelfIdentity();

// Set while an endpoint is tried with peer error handling that the shared-memory transports
// lack: UCX's error saying so is expected then (the endpoint is made without it next).
// __thread, not thread_local: an extern thread_local is read through a wrapper that calls its
// weak TLS init function if defined, and a weak undefined hidden symbol is not null in a shared
// library (the call crashes). __thread has no dynamic initialization, so no wrapper.
extern __thread bool t_expect_no_peer_failure_handler;

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry

#pragma GCC visibility pop

#endif  // FERRY_SERVICES_TRANSFER_UCX_PEER_H_
