// The UCX transport's insides (ucx_transport.h says what it does and why), declared for the files
// that define them by concept:
// - ucx_transport.cc: the worker and its progress thread (commands, the loop, timers), memory
//   registration, posting and cancelling transfers, the native-RMA path (puts and gets, flush,
//   notification) and a transfer's end;
// - ucx_peer.cc (ucx_peer.h): connections: Connect and Disconnect, remote keys, a failed peer's
//   transfers, closing and reaping endpoints, exits of peers on this host, reply connections;
// - ucx_am_protocol.cc: Ferry's active-message protocol for peers without native RMA, the
//   initiator's side (PumpAm, AdvanceAm, OnReply) and the owner's (OnPutData, OnPutCommit,
//   OnGetRequest, PumpServe), and OnAm, which dispatches every incoming message; the bulk-data
//   connections of large puts (ucx_data_socket.h): the initiator's frames (PumpAm, AdvanceAm) and
//   the owner's DataListener sink (OnDataBegin, OnDataEnd);
// - ucx_wire.cc (ucx_wire.h): the byte formats they share.
//
// Internal to the ucx_transport library. Ownership: a UcxTransport owns its worker, its regions'
// mappings, its peers (Peer) and its transfers (Transfer); UCX requests in flight name a Transfer
// or an AmOp, which live until the request completes. Threading: UcxTransport's KvTransport
// methods are thread-safe; the rest runs on the progress thread (RunSync / Enqueue) unless marked:
// regions under regions_mu_, the peers' public view under peers_mu_. Errors are absl::Status, UCX's
// ucs_status_t mapped by UcsError; a failure ends the transfer it belongs to, never the process.

#ifndef FERRY_SERVICES_TRANSFER_UCX_TRANSPORT_INTERNAL_H_
#define FERRY_SERVICES_TRANSFER_UCX_TRANSPORT_INTERNAL_H_

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/mapping_populator.h"
#include "services/transfer/notification_board.h"
#include "services/transfer/transfer_metrics.h"
#include "services/transfer/ucx_data_socket.h"
#include "services/transfer/ucx_peer.h"
#include "services/transfer/ucx_wire.h"

// Hidden visibility: nothing here is used outside the ucx_transport library (as when all of it
// was one file, with internal linkage).
#pragma GCC visibility push(hidden)

namespace ferry {
namespace transfer {
namespace ucx_internal {

// Operations a transfer keeps in flight at once (its cancellation granularity).
constexpr int kMaxInflightOps = 64;

// `what` failed with `status`: Cancelled, InvalidArgument or ResourceExhausted where UCX's code
// says so, else Unavailable.
absl::Status UcsError(absl::string_view what, ucs_status_t status);

class UcxTransport;

// kAwaitingPeer: active-message protocol only, waiting for the owner's acknowledgement (puts)
// or data and completion (gets).
enum class Phase { kPosting, kFlushing, kNotifying, kAwaitingPeer, kDone };

// A transfer posted here (UcxTransport::transfers_); progress thread only.
struct Transfer {
  UcxTransport* owner = nullptr;
  TransferId id = 0;
  Peer* peer = nullptr;
  std::string label;  // the peer's transports, for metrics
  ucp_rkey_h rkey = nullptr;
  TransferRequest request;
  std::vector<ucp_mem_h> memhs;  // per segment
  std::vector<RegionId> pinned;  // local regions held in use
  DoneCallback done;
  absl::Time start;
  uint64_t bytes = 0;
  size_t next = 0;   // next segment to post
  int inflight = 0;  // UCX requests not yet completed
  Phase phase = Phase::kPosting;
  absl::Status status;
  bool cancelled = false;
  absl::Time cancel_force_at = absl::InfiniteFuture();
  std::string notify_payload;  // kept alive while the notification is sent
  // Active-message protocol.
  uint64_t token = 0;       // names the transfer in messages: token_salt_ ^ id
  uint64_t secret = 0;      // the remote region's, from its key
  uint64_t seg_offset = 0;  // progress within segment `next`
  uint64_t received = 0;    // get: data bytes arrived
  bool peer_done = false;   // the owner's kPutAck / kGetDone arrived
  bool routed = false;      // put: via_socket chosen
  bool via_socket = false;  // put: data and commit go over the peer's bulk-data connection
  AmHeader control;         // the commit or get request, kept alive while sent
};

class UcxTransport final : public KvTransport {
 public:
  explicit UcxTransport(const TransportOptions& options)
      : options_(options),
        metrics_(options.registry),
        board_(options.early_notification_ttl, options.max_early_notifications, &metrics_, "ucx") {}

  ~UcxTransport() override;

  absl::Status Init();

  absl::string_view kind() const override { return "ucx"; }
  std::string address() const override { return address_; }
  absl::StatusOr<LocalRegion> Register(MemorySpan span) override { return Map(span, false); }
  absl::StatusOr<LocalRegion> Allocate(size_t bytes) override;
  absl::Status Deregister(RegionId id) override;
  int64_t registered_regions() const override;
  absl::StatusOr<PeerId> Connect(absl::string_view address) override;
  void Disconnect(PeerId peer) override;
  std::string PeerTransport(PeerId peer) const override;
  absl::StatusOr<TransferId> Post(TransferRequest request, DoneCallback done) override;
  void Cancel(TransferId id) override;
  void AwaitNotification(const std::string& transfer_id, absl::Time deadline,
                         DoneCallback done) override {
    board_.Await(transfer_id, deadline, std::move(done));
  }

 private:
  struct Region {
    RegionId id = 0;
    MemorySpan span;
    ucp_mem_h memh = nullptr;
    bool allocated = false;
    LocalRegion local;
    // Transfers posted here whose local memory lies in the region.
    int in_use = 0;
    // Gets a peer is being served from the region (active-message protocol).
    int serving = 0;
    // Data frames a peer's bulk-data connection is reading into the region (ucx_data_socket.h).
    int receiving = 0;
    // In the region's key: what a peer must present to write or read it through active messages.
    uint64_t secret = 0;
  };

  // ucx_internal::Transfer, named here too: as the nested struct it was, it hides the blocking
  // KvTransport::Transfer inside the class.
  using Transfer = ucx_internal::Transfer;

  // One active message in flight for a transfer, or one sent on its own (owner's replies).
  struct AmOp {
    UcxTransport* owner = nullptr;
    TransferId transfer = 0;  // 0: none
    uint64_t serve = 0;       // token of a get being served, 0: none
    AmHeader header;
    std::string payload;
  };

  // The owner's side of a put under the active-message protocol.
  struct IncomingPut {
    uint64_t received = 0;
    absl::Status status;  // first problem with the data (bad key, out of range)
    bool committed = false;
    uint64_t total = 0;
    absl::Status outcome;  // what the initiator reports in the commit
    std::string transfer_id;
    std::string initiator;  // address, for the acknowledgement
    absl::Time expires;
  };

  // The owner's side of a get under the active-message protocol: data sent from its region.
  struct Serve {
    uint64_t token = 0;
    std::string initiator;  // address, for the data and the completion
    PeerId peer = 0;        // our connection to the initiator; 0 until PumpServe makes it
    RegionId region = 0;
    ucp_mem_h memh = nullptr;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // (address, length)
    size_t next = 0;
    uint64_t offset = 0;
    int inflight = 0;
    absl::Status status;
    std::string transfer_id;
    bool done_sent = false;
  };

  // A put's acknowledgement or a handshake's answer, sent once ucp_worker_progress has returned
  // (see OnAm).
  struct PendingAck {
    std::string initiator;  // address
    AmHeader header;
    std::string message;
  };

  absl::StatusOr<LocalRegion> Map(MemorySpan span, bool allocate);
  // Runs `fn` on the progress thread and waits for it (inline when called from that thread).
  void RunSync(std::function<void()> fn);
  void Enqueue(std::function<void()> fn);
  void Loop();
  bool RunCommands();
  void CheckTimers(absl::Time now);

  // Progress-thread helpers.
  void Pump(Transfer* t);
  void Advance(Transfer* t);
  void Finish(Transfer* t);
  // Fails the peer's transfers with `status` and closes its endpoint: at once and forcibly when
  // `force` (the peer is dead or stopped answering: what is in flight may never complete), else
  // gracefully once nothing is in flight (forcibly if that takes longer than cancel_grace).
  // Forced closes are kept to real failures: UCX 1.13 breaks when an endpoint still wiring up is
  // forced closed (assertions in wireup, crashes in tcp progress).
  void FailPeer(Peer* peer, absl::Status status, bool force);
  void CloseEndpoint(Peer* peer, bool force);
  // Fails the peers whose process has exited.
  void CheckExits();
  void ReapPeers();
  void SendNotification(Transfer* t);
  // The peer region's unpacked key (cached per peer); a region UCX maps into this process
  // (shared memory) is handed to populator_ on the first unpack.
  absl::StatusOr<ucp_rkey_h> RemoteKey(Peer* peer, const RegionDescriptor& region);
  Peer* FindPeer(PeerId id);

  // Active-message protocol (peers without native RMA).
  void PumpAm(Transfer* t);
  void AdvanceAm(Transfer* t);
  // `reply`: UCP_AM_SEND_FLAG_REPLY, which UCX sends only once the endpoint's wireup with the
  // peer is complete (it needs the peer's endpoint id): the handshake's kHello (see Connect).
  ucs_status_ptr_t SendAm(Peer* peer, AmOp* op, const void* data, size_t length, ucp_mem_h memh,
                          bool reply = false);
  // Sends a message no transfer waits for (replies); failures are logged, not reported.
  void SendOneWay(Peer* peer, const AmHeader& header, std::string payload, bool reply = false);
  // Connect's work: the endpoint (or the live one already made to `address`), and with `hello`
  // the handshake's first message on a new one. Never waits for the handshake.
  absl::StatusOr<PeerId> OpenPeer(absl::string_view address, bool hello);
  // Waits (bounded by kHandshakeTimeout) until the peer has answered the handshake.
  absl::StatusOr<PeerId> AwaitHandshake(PeerId id);
  // A working connection to an initiator, for replies: Connect, again if the one found failed.
  // Never from inside ucp_worker_progress (see OnAm).
  absl::StatusOr<Peer*> ReplyPeer(const std::string& address);
  // Sends the acknowledgements FinalizePut queued (after ucp_worker_progress returns).
  void SendPendingAcks();
  void OnPutData(const AmHeader& h, absl::string_view data);
  void OnPutCommit(const AmHeader& h, absl::string_view data);
  // DataListener's sink (its connections' threads): checks a data frame and holds its region
  // (returns the region id); releases it and accounts the bytes on the progress thread.
  absl::StatusOr<uint64_t> OnDataBegin(const DataFrameHeader& h);
  void OnDataEnd(const DataFrameHeader& h, uint64_t region, uint64_t received, absl::Status status);
  // A put's frame was refused or its bytes did not all arrive: the put fails.
  void FailIncoming(uint64_t token, absl::Status status);
  // A frame of put `t` left (its bytes in the kernel) or failed; progress thread.
  void OnFrameSent(TransferId id, absl::Status status);
  // Sends a frame of `t` on its peer's bulk-data connection (made here on the first).
  void SendFrame(Transfer* t, const DataFrameHeader& header, const void* data, std::string payload);
  // Finalizes the put once it is committed and every byte is in place (or it failed).
  void MaybeFinalizePut(uint64_t token, IncomingPut& in);
  void FinalizePut(uint64_t token, IncomingPut& in);
  void OnGetRequest(const AmHeader& h, absl::string_view data);
  void PumpServe(Serve* serve);
  void OnReply(const AmHeader& h, absl::string_view data);
  // The region holding [address, address + length) whose secret is `secret`, or an error.
  absl::StatusOr<Region*> RemoteAccess(uint64_t address, uint64_t length, uint64_t secret)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(regions_mu_);
  void ExpireIncoming(absl::Time now);

  static void OnOpDone(void* request, ucs_status_t status, void* user_data);
  static void OnAmOpDone(void* request, ucs_status_t status, void* user_data);
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static ucs_status_t OnAm(void* arg, const void* header, size_t header_length, void* data,
                           size_t length, const ucp_am_recv_param_t* param);

  const TransportOptions options_;
  TransferMetrics metrics_;
  NotificationBoard board_;

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  ProcessIdentity self_;
  std::vector<const char*> env_set_;  // environment variables Init set for the worker
  int epoll_fd_ = -1;
  // The pidfds of peers on this host, readable when the peer process exits.
  int exit_epoll_fd_ = -1;
  // The owner's side of the bulk-data connections; null when it could not listen.
  std::unique_ptr<DataListener> data_listener_;
  int worker_fd_ = -1;
  int command_fd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  absl::Mutex queue_mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(queue_mu_);
  std::atomic<bool> has_commands_{false};
  bool stopping_ = false;     // progress thread only
  absl::Time stop_deadline_;  // progress thread only

  mutable absl::Mutex regions_mu_;
  std::map<uint64_t, Region> regions_ ABSL_GUARDED_BY(regions_mu_);  // by start address
  uint64_t region_bytes_ ABSL_GUARDED_BY(regions_mu_) = 0;
  RegionId next_region_id_ ABSL_GUARDED_BY(regions_mu_) = 1;

  mutable absl::Mutex peers_mu_;
  std::map<PeerId, PeerInfo> peer_info_ ABSL_GUARDED_BY(peers_mu_);
  PeerId next_peer_id_ ABSL_GUARDED_BY(peers_mu_) = 1;
  std::deque<PeerId> failed_peers_ ABSL_GUARDED_BY(peers_mu_);
  static constexpr size_t kMaxFailedPeers = 1024;
  static constexpr absl::Duration kHandshakeTimeout = absl::Seconds(5);
  static constexpr absl::Duration kHelloResend = absl::Milliseconds(100);

  std::atomic<TransferId> next_transfer_id_{1};
  MappingPopulator populator_;

  // Progress thread only.
  std::map<PeerId, std::unique_ptr<Peer>> peers_;
  std::map<TransferId, std::unique_ptr<Transfer>> transfers_;
  // Transfers an operation completion touched: advanced after ucp_worker_progress returns (UCX
  // callbacks never re-enter the transport's bookkeeping).
  std::vector<TransferId> touched_;
  std::map<uint64_t, IncomingPut> incoming_puts_;
  std::map<uint64_t, std::unique_ptr<Serve>> serves_;
  std::vector<uint64_t> touched_serves_;
  std::vector<PendingAck> pending_acks_;
  // Set while ucp_worker_progress runs (and so UCX may be inside one of the callbacks above).
  bool in_worker_progress_ = false;
  // Transfers abandoned with requests UCX never completed; freed after the worker.
  std::vector<std::unique_ptr<Transfer>> orphans_;
  static constexpr absl::Duration kAbandonAfter = absl::Seconds(1);

  absl::BitGen bitgen_;  // progress thread only
  const uint64_t token_salt_ = absl::Uniform<uint64_t>(absl::BitGen());
};

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry

#pragma GCC visibility pop

#endif  // FERRY_SERVICES_TRANSFER_UCX_TRANSPORT_INTERNAL_H_
