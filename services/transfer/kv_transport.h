// The KV transport (ARCHITECTURE.md §3, steps 4-5): one-sided bulk movement of KV blocks between
// processes: prefill -> decode, store -> prefill, decode -> decode on drain.
//
// A process registers the memory its peers may touch (a KV block pool's region, a staging
// buffer) and sends each peer a RegionDescriptor plus its transport address, as opaque bytes
// inside a gRPC message (ferry.v1.TransferDescriptor; see transfer_wire.h). The peer connects to
// the address and posts transfers: a batch of scatter/gather segments, each `length` bytes
// between a local address and a remote address, all puts (local -> remote) or all gets
// (remote -> local). The owner of the remote memory takes no part in moving the bytes.
//
//   // Decode side: memory the prefill worker may write, and an outcome to wait for.
//   auto region = transport->Allocate(pool_bytes);          // or Register(existing span)
//   transport->AwaitNotification("req-17", deadline, [](absl::Status s) { /* blocks ready */ });
//   send {transport->address(), region->descriptor} to the prefill worker over gRPC
//
//   // Prefill side:
//   auto peer = transport->Connect(descriptor_address);
//   TransferRequest put{.peer = *peer, .op = TransferOp::kPut, .remote = descriptor,
//                       .segments = {{src, dst, block_bytes}, ...},
//                       .deadline = absl::Now() + absl::Seconds(5), .transfer_id = "req-17"};
//   transport->Post(std::move(put), [](absl::Status s) { /* release the source blocks */ });
//
// Completion. A transfer's callback runs exactly once, with OK only when every byte is in
// place: for puts, in the remote memory (the initiator flushes before it reports success); for
// gets, in the local memory. When the callback runs the transport no longer touches the
// transfer's memory, whatever the outcome, so the caller may release blocks and registrations
// from it. If the request has a transfer_id, the owner of the remote memory learns the outcome
// too: its AwaitNotification(transfer_id) callback runs with OK after the bytes are in place
// (puts) or have been read (gets), and with an error if the initiator reports a failure, its
// connection breaks (where the transport can tell), or the await's own deadline passes first.
//
// Failure. Every transfer has a deadline; one still running at its deadline is cancelled and
// completes with DEADLINE_EXCEEDED (at the latest cancel_grace later, once operations already in
// flight are accounted for). A dead or unreachable peer fails its transfers with UNAVAILABLE
// (UCX runs in peer error-handling mode where its transports have it, and watches the process of
// a same-host peer where they do not: a dead peer is an error, not a hang).
// Cancel() stops a transfer early (CANCELLED). A transport that has to force the connection
// closed to get its memory back (operations in flight to a peer that stopped answering) fails
// the peer's other transfers with it (UNAVAILABLE) and marks the peer failed: Post on it fails
// from then on, and Connect(address) makes a new connection. No call waits without a bound.
//
// Threads. Every method is thread-safe. Callbacks run on a transport thread and must not block
// (no Wait* on the same transport from inside one); they may Post or Cancel.
//
// Implementations: UCX (ucp; one progress thread per worker) and gRPC streaming, the fallback
// where UCX is unavailable. Both export the same metrics (transfer_metrics.h).

#ifndef FERRY_SERVICES_TRANSFER_KV_TRANSPORT_H_
#define FERRY_SERVICES_TRANSFER_KV_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/kv/kv_allocator.h"
#include "services/common/shared_token.h"

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace ferry {
namespace transfer {

using RegionId = uint64_t;
using PeerId = uint64_t;
using TransferId = uint64_t;

// What a peer needs to read or write one registered region: [address, address + length) in the
// owner's address space, and the transport's key for it (UCX: a packed rkey; gRPC: a token).
struct RegionDescriptor {
  uint64_t address = 0;
  uint64_t length = 0;
  std::string remote_key;
};

// A region registered with this transport.
struct LocalRegion {
  RegionId id = 0;
  MemorySpan span;
  // To send to the peers that may access the region.
  RegionDescriptor descriptor;
};

enum class TransferOp { kPut, kGet };
absl::string_view TransferOpName(TransferOp op);  // "put" / "get"

// `length` bytes between local_address (inside a region registered with this transport) and
// remote_address (inside the request's remote region).
struct TransferSegment {
  uint64_t local_address = 0;
  uint64_t remote_address = 0;
  uint64_t length = 0;
};

// Limits, checked by Post (InvalidArgument beyond them).
inline constexpr size_t kMaxSegmentsPerTransfer = 65536;
inline constexpr size_t kMaxTransferIdBytes = 128;

struct TransferRequest {
  PeerId peer = 0;
  TransferOp op = TransferOp::kPut;
  // The peer's region every segment's remote side lies in.
  RegionDescriptor remote;
  // Performed in any order, possibly concurrently; segments must not overlap on the side that
  // is written. Zero-length segments are refused.
  std::vector<TransferSegment> segments;
  // Required (a finite time): the transfer completes by then, with DEADLINE_EXCEEDED if its
  // bytes have not all moved.
  absl::Time deadline = absl::InfiniteFuture();
  // Non-empty: the peer's AwaitNotification(transfer_id) learns the outcome (at most
  // kMaxTransferIdBytes bytes).
  std::string transfer_id;
};

using DoneCallback = std::function<void(absl::Status)>;

struct TransportOptions {
  // "ucx" or "grpc".
  std::string kind = "ucx";
  // UCX only: the UCX transports to use, in UCX_TLS syntax ("tcp", "shm", "rc,sm", ...). Empty:
  // the UCX_TLS environment variable, else UCX's own choice.
  std::string ucx_tls;
  // gRPC only: the address the transport's server listens on ("host:port"; port 0 picks one).
  // The address peers connect to is address().
  std::string listen_address = "127.0.0.1:0";
  // gRPC only: the host address() names ("": listen_address's, which must then not be a
  // wildcard such as 0.0.0.0: Create fails). UCX's address is the worker address blob that
  // ucp_worker_get_address packs: it lists the addresses of the devices UCX uses itself
  // (UCX_NET_DEVICES), so no host is advertised for it (services/common/advertise_address.h).
  std::string advertise_host;
  // gRPC only: data bytes per streamed message.
  size_t grpc_chunk_bytes = size_t{1} << 20;
  // gRPC only: the shared token (services/common/shared_token.h) the transport's server requires
  // of every call, and its calls to peers carry (a handle: a rotation applies to the next call);
  // none: calls are not checked. UCX carries no token: its endpoints belong on a network only
  // the workers reach.
  SharedToken auth_token;
  // Gives the in-flight operations of a transfer cancelled or past its deadline this long to
  // finish before the connection to the peer is forced closed (see the header comment).
  absl::Duration cancel_grace = absl::Milliseconds(200);
  // A notification that arrives before its AwaitNotification is kept this long (and at most
  // max_early_notifications of them, oldest dropped first).
  absl::Duration early_notification_ttl = absl::Seconds(60);
  size_t max_early_notifications = 65536;
  // Where the transport's metrics go (transfer_metrics.h); null: not exported. Must outlive the
  // transport.
  prometheus::Registry* registry = nullptr;
};

class KvTransport {
 public:
  // InvalidArgument for a bad kind or option; Unavailable when the transport cannot start (UCX
  // finds no usable transport among ucx_tls, the gRPC port cannot be bound).
  static absl::StatusOr<std::unique_ptr<KvTransport>> Create(const TransportOptions& options);

  // Fails every transfer and await still pending (CANCELLED), waits for the transport's threads,
  // then frees what Allocate gave (registered spans stay the caller's).
  virtual ~KvTransport() = default;

  // "ucx" or "grpc".
  virtual absl::string_view kind() const = 0;
  // The bytes a peer passes to Connect (UCX: the worker address; gRPC: "host:port").
  virtual std::string address() const = 0;

  // Registers caller memory for remote access (the span must stay valid until Deregister).
  // Registrations may not overlap (AlreadyExists).
  virtual absl::StatusOr<LocalRegion> Register(MemorySpan span) = 0;
  // Memory from the transport, registered (page-aligned, zeroed). UCX allocates it where its
  // shared-memory transports can map it into a peer, so prefer this for KV pools (see
  // TransportKvAllocator).
  virtual absl::StatusOr<LocalRegion> Allocate(size_t bytes) = 0;
  // Ends a registration (and frees an allocation). NotFound for an unknown id;
  // FailedPrecondition while a transfer posted here still uses the region.
  virtual absl::Status Deregister(RegionId id) = 0;
  // Live registrations (for leak checks and the registered_regions metric).
  virtual int64_t registered_regions() const = 0;

  // A connection to the peer at `address`. Connecting twice to a live peer returns the same id;
  // after the peer failed, a new one. InvalidArgument for an address that cannot be parsed,
  // Unavailable when the peer cannot be reached. UCX: blocks for a round trip to the peer (a
  // handshake, at most 5 s) the first time, not again while the connection lives.
  virtual absl::StatusOr<PeerId> Connect(absl::string_view address) = 0;
  // Fails the peer's transfers (CANCELLED) and closes the connection.
  virtual void Disconnect(PeerId peer) = 0;
  // What carries the traffic to `peer`, for logs and metric labels: "ucx:tcp", "ucx:posix+cma",
  // "grpc". Empty for an unknown peer.
  virtual std::string PeerTransport(PeerId peer) const = 0;

  // Starts a transfer; `done` runs exactly once (see the header comment), possibly before Post
  // returns. Errors Post returns instead (and then `done` never runs): InvalidArgument for a
  // malformed request (no segments, a zero-length, overlapping-write or out-of-region segment,
  // an unregistered local address, no finite deadline, a transfer_id too long, a remote key this
  // transport cannot use), NotFound/Unavailable for an unknown or failed peer.
  virtual absl::StatusOr<TransferId> Post(TransferRequest request, DoneCallback done) = 0;
  // Cancels a transfer still running (its callback gets CANCELLED, once its operations are
  // accounted for); nothing for one already finished or unknown.
  virtual void Cancel(TransferId id) = 0;

  // The target side: `done` runs once, with the outcome of the transfer a peer posts with this
  // transfer_id (OK: the bytes are in place / were read), or DEADLINE_EXCEEDED at `deadline`,
  // or CANCELLED if the transport shuts down. A notification that arrived earlier is delivered
  // at once. A second await on an id already awaited is refused (AlreadyExists, via `done`).
  virtual void AwaitNotification(const std::string& transfer_id, absl::Time deadline,
                                 DoneCallback done) = 0;

  // Blocking forms (never from inside a callback of this transport).
  absl::Status Transfer(TransferRequest request);
  absl::Status WaitNotification(const std::string& transfer_id, absl::Time deadline);
};

// Validates what every implementation requires of a request before it touches memory: segments
// present and within kMaxSegmentsPerTransfer, each non-empty, inside `remote` (without overflow),
// written sides not overlapping, a finite deadline, transfer_id within kMaxTransferIdBytes.
// Local-address registration is checked by the implementation (it knows its regions).
absl::Status ValidateTransferRequest(const TransferRequest& request);

// A KvAllocator (engine/kv) whose memory comes from KvTransport::Allocate, so a KV block pool
// can be read and written by peers. Host memory: for the CPU backend (the CUDA backend stages
// through pinned host buffers). The transport must outlive the allocator and its allocations.
//
// A pool's blocks hold whatever they held before they are written (stale KV once reused), so
// Allocate leaves one non-zero byte at the start of every 4 KiB page: memory the transport zeroed
// and nothing wrote since can be taken back by the hypervisor of a virtual machine (this
// project's KVM guests do it to pages that are all zero), and a push into such blocks, the
// never-used part of a decode worker's pool, then waits on faults the guest cannot see. Measured
// here, 94 MB written in 48 KiB copies into zeroed memory idle for 20 s: 44-286 ms, against 13 ms
// fresh and 19-30 ms with the byte. The byte is a finite value in every KV element type (a bf16,
// f16 or f32 denormal), and nothing reads a block before writing it.
//
// Free deregisters the allocation. While a transfer still uses the region (FailedPrecondition)
// it waits for it, up to `free_wait` (transfers end by their deadlines); past that, or on any
// other failure, it logs the error and leaves the region registered: memory a peer may still
// write is never handed back.
class TransportKvAllocator : public KvAllocator {
 public:
  explicit TransportKvAllocator(KvTransport* transport,
                                absl::Duration free_wait = absl::Seconds(60))
      : transport_(transport), free_wait_(free_wait) {}
  absl::StatusOr<MemorySpan> Allocate(size_t bytes) override;
  void Free(const MemorySpan& region) override;
  // The registration of the allocation at `address` (to describe it to peers); NotFound if none.
  absl::StatusOr<LocalRegion> RegionOf(const void* address) const;
  // The transport is about to be destroyed (it frees its allocations itself): Free does nothing
  // from here on. For a service whose transport must go before its pools (the transport's last
  // callbacks still give blocks back to the pools); nothing may use the memory afterwards.
  void Detach();

 private:
  KvTransport* const transport_;
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  const absl::Duration free_wait_;
  mutable absl::Mutex mu_;
  std::vector<LocalRegion> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_KV_TRANSPORT_H_
