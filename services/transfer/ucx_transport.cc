#include "services/transfer/ucx_transport.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/common/log.h"
#include "services/transfer/mapping_populator.h"
#include "services/transfer/notification_board.h"
#include "services/transfer/streaming_copy.h"
#include "services/transfer/transfer_metrics.h"

namespace ferry {
namespace transfer {
namespace {

// Prefixes of the opaque bytes this transport hands out, so that bytes from another transport
// (or garbage) are refused before UCX parses them.
constexpr absl::string_view kAddressMagic = "FERRY-UCX-ADDR1:";
constexpr absl::string_view kKeyMagic = "FERRY-UCX-RKEY1:";
// Active message id of every message between Ferry transports; AmHeader::type tells them apart.
constexpr unsigned kFerryAmId = 7;
// Data bytes per active message when UCX has no native RMA to the peer (see ucx_transport.h).
constexpr size_t kAmChunkBytes = size_t{48} << 10;

// The messages (all little-endian; peers share the byte order, as UCX's own wire format does).
enum class AmType : uint32_t {
  kNotify = 1,      // initiator -> owner: a transfer's outcome (native RMA path); data = outcome
  kPutData = 2,     // initiator -> owner: token, a = remote address, b = region secret; data
  kPutCommit = 3,   // initiator -> owner: token, a = total bytes, code; data = address + outcome
  kPutAck = 4,      // owner -> initiator: token, code; data = message
  kGetRequest = 5,  // initiator -> owner: token, b = secret; data = address, id, ranges
  kGetData = 6,     // owner -> initiator: token, a = segment index, b = offset; data
  kGetDone = 7,     // owner -> initiator: token, code; data = message
};

struct AmHeader {
  uint32_t type = 0;
  uint32_t code = 0;
  uint64_t token = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};

// Transports whose RMA UCX performs natively (the peer's CPU takes no part); over others (tcp,
// ud) UCX 1.13 emulates puts and gets in software on the target, and a target whose initiator
// dies mid-transfer aborts inside UCX (ucp_put_handler: "Fatal: unexpected error"), so those
// peers get Ferry's own protocol over active messages instead.
bool HasNativeRma(absl::string_view transports) {
  static const char* const kNative[] = {"posix",    "sysv",     "cma",     "xpmem", "knem",
                                        "rc_verbs", "rc_mlx5",  "dc_mlx5", "rc",    "dc",
                                        "cuda_ipc", "rocm_ipc", "self"};
  for (absl::string_view name : absl::StrSplit(transports, '+')) {
    for (const char* native : kNative) {
      if (name == native) return true;
    }
  }
  return false;
}
// Operations a transfer keeps in flight at once (its cancellation granularity).
constexpr int kMaxInflightOps = 64;
// After the last event the progress thread polls this long before it sleeps.
constexpr absl::Duration kSpin = absl::Milliseconds(2);

absl::Status UcsError(absl::string_view what, ucs_status_t status) {
  const std::string message = absl::StrCat(what, ": ", ucs_status_string(status));
  switch (status) {
    case UCS_ERR_CANCELED:
      return absl::CancelledError(message);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return absl::InvalidArgumentError(message);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

// Whether the context has an RDMA transport (from ucp_context_print_info's resource lines, e.g.
// "rc_mlx5/mlx5_0:1"; UCX 1.13 has no query for them).
bool HasRdma(ucp_context_h context) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return true;  // unknown: keep UCX's defaults
  ucp_context_print_info(context, stream);
  fclose(stream);
  const absl::string_view info(buffer, size);
  bool rdma = false;
  for (absl::string_view name : {"rc_verbs/", "rc_mlx5/", "dc_mlx5/", "ud_verbs/", "ud_mlx5/"}) {
    rdma |= absl::StrContains(info, name);
  }
  free(buffer);
  return rdma;
}

// Set while an endpoint is tried with peer error handling that the shared-memory transports
// lack: UCX's error saying so is expected then (the endpoint is made without it next).
thread_local bool t_expect_no_peer_failure_handler = false;

// UCX's log lines go through Ferry's log (stderr, Ferry's format) instead of UCX's default
// (stdout, where they mix with a tool's output).
ucs_log_func_rc_t RouteUcxLog(const char* file, unsigned line, const char* function,
                              ucs_log_level_t level, const ucs_log_component_config_t* comp_conf,
                              const char* message, va_list ap) {
  char text[1024];
  va_list copy;
  va_copy(copy, ap);
  vsnprintf(text, sizeof(text), message, copy);
  va_end(copy);
  if (t_expect_no_peer_failure_handler && strstr(text, "no peer failure handler") != nullptr) {
    return UCS_LOG_FUNC_RC_STOP;
  }
  const char* base = strrchr(file, '/');
  const std::string where = absl::StrCat("UCX ", base != nullptr ? base + 1 : file, ":", line, " ");
  if (level <= UCS_LOG_LEVEL_ERROR) {
    LOG(ERROR) << where << text;
  } else if (level == UCS_LOG_LEVEL_WARN) {
    LOG(WARNING) << where << text;
  } else {
    LOG(INFO) << where << text;
  }
  return UCS_LOG_FUNC_RC_STOP;
}

// The transports of an endpoint's lanes, from ucp_ep_print_info (UCX 1.13 has no query for
// them): lines like "#   lane[0]:  3:tcp/lo.0 md[1] ..." -> "tcp". Sorted, joined by '+'.
std::string EndpointTransports(ucp_ep_h ep) {
  char* buffer = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&buffer, &size);
  if (stream == nullptr) return "unknown";
  ucp_ep_print_info(ep, stream);
  fclose(stream);
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(absl::string_view(buffer, size), '\n')) {
    const size_t lane = line.find("lane[");
    if (lane == absl::string_view::npos) continue;
    absl::string_view rest = line.substr(lane);
    const size_t colon = rest.find(':');
    if (colon == absl::string_view::npos) continue;
    rest = absl::StripLeadingAsciiWhitespace(rest.substr(colon + 1));
    // "3:tcp/lo.0 ..." -> "tcp"
    const size_t index_end = rest.find(':');
    if (index_end == absl::string_view::npos) continue;
    rest = rest.substr(index_end + 1);
    const size_t slash = rest.find('/');
    if (slash == absl::string_view::npos || slash == 0) continue;
    names.insert(std::string(rest.substr(0, slash)));
  }
  free(buffer);
  if (names.empty()) return "unknown";
  return absl::StrJoin(names, "+");
}

// Who a process is on its host, carried in its transport address so that a peer on the same host
// can watch for its exit (pidfd): UCX's shared-memory transports have no peer failure detection.
struct ProcessIdentity {
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: the host (and boot)
  uint64_t pid_namespace = 0;
  uint32_t pid = 0;
  uint64_t start_time = 0;  // /proc/<pid>/stat field 22: tells a reused pid apart
};
constexpr size_t kBootIdBytes = 36;
constexpr size_t kIdentityBytes = kBootIdBytes + 8 + 4 + 8;

// Field 22 (starttime) of /proc/<pid>/stat; 0 if the process does not exist.
uint64_t ProcessStartTime(uint32_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  // After ")": field 3 (state) onwards; starttime is field 22.
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(paren + 1), ' ', absl::SkipEmpty());
  uint64_t start = 0;
  if (fields.size() < 20 || !absl::SimpleAtoi(fields[19], &start)) return 0;
  return start;
}

ProcessIdentity SelfIdentity() {
  ProcessIdentity self;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::getline(boot, self.boot_id);
  self.boot_id.resize(kBootIdBytes, ' ');
  char link[64] = {};
  if (readlink("/proc/self/ns/pid", link, sizeof(link) - 1) > 0) {
    // "pid:[4026531836]"
    absl::string_view text(link);
    if (absl::ConsumePrefix(&text, "pid:[") && absl::ConsumeSuffix(&text, "]")) {
      (void)absl::SimpleAtoi(text, &self.pid_namespace);
    }
  }
  self.pid = static_cast<uint32_t>(getpid());
  self.start_time = ProcessStartTime(self.pid);
  return self;
}

void AppendLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t ReadLe(absl::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

std::string EncodeIdentity(const ProcessIdentity& id) {
  std::string out = id.boot_id;
  AppendLe(&out, id.pid_namespace, 8);
  AppendLe(&out, id.pid, 4);
  AppendLe(&out, id.start_time, 8);
  return out;
}

ProcessIdentity DecodeIdentity(absl::string_view in) {
  ProcessIdentity id;
  id.boot_id = std::string(in.substr(0, kBootIdBytes));
  id.pid_namespace = ReadLe(in, kBootIdBytes, 8);
  id.pid = static_cast<uint32_t>(ReadLe(in, kBootIdBytes + 8, 4));
  id.start_time = ReadLe(in, kBootIdBytes + 12, 8);
  return id;
}

// The payload of a notification: code (4 bytes LE), id length (4 bytes LE), id, message.
std::string EncodeNotification(const std::string& transfer_id, const absl::Status& status) {
  std::string out;
  const uint32_t code = static_cast<uint32_t>(status.code());
  const uint32_t length = static_cast<uint32_t>(transfer_id.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(code >> (8 * i)));
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(length >> (8 * i)));
  out += transfer_id;
  out.append(status.message().data(), std::min<size_t>(status.message().size(), 512));
  return out;
}

bool DecodeNotification(absl::string_view in, std::string* transfer_id, absl::Status* status) {
  if (in.size() < 8) return false;
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i)
      v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
    return v;
  };
  const uint32_t code = u32(0), length = u32(4);
  if (length > kMaxTransferIdBytes || in.size() < 8 + length || code > 16) return false;
  *transfer_id = std::string(in.substr(8, length));
  const absl::string_view message = in.substr(8 + length);
  *status = code == 0 ? absl::OkStatus()
                      : absl::Status(static_cast<absl::StatusCode>(code),
                                     absl::StrCat("initiator reports: ", message));
  return true;
}

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
    // In the region's key: what a peer must present to write or read it through active messages.
    uint64_t secret = 0;
  };

  struct Transfer;

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
  };

  struct PeerInfo {
    std::string address;
    std::string label;
    bool failed = false;
  };

  // kAwaitingPeer: active-message protocol only, waiting for the owner's acknowledgement (puts)
  // or data and completion (gets).
  enum class Phase { kPosting, kFlushing, kNotifying, kAwaitingPeer, kDone };

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
    AmHeader control;         // the commit or get request, kept alive while sent
  };

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

  // A put's acknowledgement, sent once ucp_worker_progress has returned (see OnAm).
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
  ucs_status_ptr_t SendAm(Peer* peer, AmOp* op, const void* data, size_t length, ucp_mem_h memh);
  // Sends a message no transfer waits for (replies); failures are logged, not reported.
  void SendOneWay(Peer* peer, const AmHeader& header, std::string payload);
  // A working connection to an initiator, for replies: Connect, again if the one found failed.
  // Never from inside ucp_worker_progress (see OnAm).
  absl::StatusOr<Peer*> ReplyPeer(const std::string& address);
  // Sends the acknowledgements FinalizePut queued (after ucp_worker_progress returns).
  void SendPendingAcks();
  void OnPutData(const AmHeader& h, absl::string_view data);
  void OnPutCommit(const AmHeader& h, absl::string_view data);
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

absl::Status UcxTransport::Init() {
  static const bool log_routed = [] {
    ucs_log_push_handler(&RouteUcxLog);
    return true;
  }();
  (void)log_routed;
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) return UcsError("ucp_config_read", status);
  if (!options_.ucx_tls.empty()) {
    status = ucp_config_modify(config, "TLS", options_.ucx_tls.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(absl::StrCat("UCX refuses ucx_tls '", options_.ucx_tls,
                                                     "': ", ucs_status_string(status)));
    }
  }
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  status = ucp_init(&params, config, &context_);
  if (status == UCS_OK && !HasRdma(context_) && getenv("UCX_ZCOPY_THRESH") == nullptr) {
    // Without RDMA, peers on other hosts are reached over tcp with Ferry's active messages, and
    // UCX 1.13 aborts ("uct_iface.h: Assertion `comp->count > 0'") when a tcp endpoint fails with
    // zero-copy sends in flight: copy-based sends only (about half the tcp throughput).
    // Copy-based tcp sends move 8 KiB segments by default; 256 KiB ones bring the throughput
    // back (measured here: 0.7 -> 2-4 GB/s). Read from the environment when the worker opens
    // its interfaces; a user's own setting wins.
    for (const char* name : {"UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"}) {
      if (getenv(name) == nullptr) {
        setenv(name, "256K", /*overwrite=*/0);
        env_set_.push_back(name);
      }
    }
    ucp_cleanup(context_);
    context_ = nullptr;
    status = ucp_config_modify(config, "ZCOPY_THRESH", "inf");
    if (status == UCS_OK) status = ucp_init(&params, config, &context_);
  }
  ucp_config_release(config);
  if (status != UCS_OK) return UcsError("ucp_init", status);

  ucp_worker_params_t worker_params = {};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  // The worker has read its interfaces' settings: what Init set is not left for later contexts.
  for (const char* name : env_set_) unsetenv(name);
  if (status != UCS_OK) return UcsError("ucp_worker_create", status);

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(worker_, &address, &address_length);
  if (status != UCS_OK) return UcsError("ucp_worker_get_address", status);
  self_ = SelfIdentity();
  address_ =
      absl::StrCat(kAddressMagic, EncodeIdentity(self_),
                   absl::string_view(reinterpret_cast<const char*>(address), address_length));
  ucp_worker_release_address(worker_, address);

  ucp_am_handler_param_t am = {};
  am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                  UCP_AM_HANDLER_PARAM_FIELD_ARG;
  am.id = kFerryAmId;
  am.cb = &UcxTransport::OnAm;
  am.arg = this;
  status = ucp_worker_set_am_recv_handler(worker_, &am);
  if (status != UCS_OK) return UcsError("ucp_worker_set_am_recv_handler", status);

  status = ucp_worker_get_efd(worker_, &worker_fd_);
  if (status != UCS_OK) return UcsError("ucp_worker_get_efd", status);
  command_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  exit_epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (command_fd_ < 0 || epoll_fd_ < 0 || exit_epoll_fd_ < 0) {
    return absl::InternalError(absl::StrCat("eventfd/epoll: ", strerror(errno)));
  }
  for (int fd : {worker_fd_, command_fd_, exit_epoll_fd_}) {
    epoll_event event = {};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(errno)));
    }
  }
  thread_ = std::thread([this] {
    thread_id_.store(std::this_thread::get_id());
    Loop();
  });
  LOG(INFO) << "KV transport: UCX " << ucp_get_version_string() << " worker ready (UCX_TLS "
            << (options_.ucx_tls.empty() ? "default" : options_.ucx_tls) << ")";
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    Enqueue([this] {
      stopping_ = true;
      stop_deadline_ = absl::Now() + absl::Seconds(2);
      for (auto& [id, t] : transfers_) {
        if (t->status.ok()) t->status = absl::CancelledError("KV transport is shutting down");
        t->cancelled = true;
      }
      for (auto& [id, peer] : peers_) {
        FailPeer(peer.get(), absl::CancelledError("KV transport is shutting down"), false);
      }
    });
    thread_.join();
    populator_.Stop();  // before the worker goes with the peers' mappings
    // From here this thread owns the worker (stopping_ is set: incoming messages are dropped).
    thread_id_.store(std::this_thread::get_id());
    // Let messages UCX still has to send for connections being set up or torn down (wireup
    // replies, endpoint removals) go out: UCX 1.13 asserts when a worker is destroyed with a
    // wireup reply pending.
    const absl::Time start = absl::Now();
    absl::Time last_busy = start;
    for (absl::Time now = start; now - start < absl::Seconds(1); now = absl::Now()) {
      if (ucp_worker_progress(worker_) != 0) last_busy = now;
      if (now - last_busy > absl::Milliseconds(50)) break;
    }
  }
  board_.Shutdown();
  {
    absl::MutexLock lock(&regions_mu_);
    for (auto& [address, region] : regions_) {
      if (context_ != nullptr) ucp_mem_unmap(context_, region.memh);
    }
    regions_.clear();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  orphans_.clear();
  if (context_ != nullptr) ucp_cleanup(context_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
  if (exit_epoll_fd_ >= 0) close(exit_epoll_fd_);
  if (command_fd_ >= 0) close(command_fd_);
}

void UcxTransport::Enqueue(std::function<void()> fn) {
  {
    absl::MutexLock lock(&queue_mu_);
    commands_.push_back(std::move(fn));
    has_commands_.store(true, std::memory_order_release);
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(command_fd_, &one, sizeof(one));
}

void UcxTransport::RunSync(std::function<void()> fn) {
  if (std::this_thread::get_id() == thread_id_.load()) {
    fn();
    return;
  }
  absl::Notification done;
  Enqueue([&] {
    fn();
    done.Notify();
  });
  done.WaitForNotification();
}

bool UcxTransport::RunCommands() {
  if (!has_commands_.load(std::memory_order_acquire)) return false;
  std::deque<std::function<void()>> commands;
  {
    absl::MutexLock lock(&queue_mu_);
    commands.swap(commands_);
    has_commands_.store(false, std::memory_order_release);
  }
  uint64_t drained;
  [[maybe_unused]] ssize_t n = read(command_fd_, &drained, sizeof(drained));
  for (auto& fn : commands) fn();
  return !commands.empty();
}

void UcxTransport::Loop() {
  absl::Time last_busy = absl::Now();
  absl::Time last_timers = absl::InfinitePast();
  while (true) {
    bool busy = RunCommands();
    in_worker_progress_ = true;
    busy |= ucp_worker_progress(worker_) != 0;
    in_worker_progress_ = false;
    if (!touched_.empty()) {
      std::vector<TransferId> touched;
      touched.swap(touched_);
      for (TransferId id : touched) {
        auto it = transfers_.find(id);
        if (it != transfers_.end()) Pump(it->second.get());
      }
      busy = true;
    }
    if (!touched_serves_.empty()) {
      std::vector<uint64_t> touched;
      touched.swap(touched_serves_);
      for (uint64_t token : touched) {
        auto it = serves_.find(token);
        if (it != serves_.end()) PumpServe(it->second.get());
      }
      busy = true;
    }
    if (!pending_acks_.empty()) {
      SendPendingAcks();
      busy = true;
    }
    const absl::Time now = absl::Now();
    if (now - last_timers >= absl::Microseconds(200)) {
      CheckTimers(now);
      ExpireIncoming(now);
      CheckExits();
      ReapPeers();
      last_timers = now;
    }
    // Graceful closes of peers that died meanwhile may wait for UCX's failure detection: the
    // transport does not wait for them past stop_deadline_.
    if (stopping_ && transfers_.empty() && serves_.empty() &&
        (peers_.empty() || now > stop_deadline_)) {
      break;
    }
    if (busy) {
      last_busy = now;
      continue;
    }
    if (now - last_busy < kSpin) {
      // Polling for the next event; a thread this one woke (a caller waiting on a callback)
      // gets the core first.
      sched_yield();
      continue;
    }
    // Idle: sleep until UCX or a command wakes us, or the next timer check.
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    if (has_commands_.load(std::memory_order_acquire)) continue;
    epoll_event events[2];
    bool closing = stopping_;
    for (const auto& [id, peer] : peers_) closing |= peer->failed;
    absl::Time wake = now + absl::Milliseconds(100);
    for (const auto& [id, t] : transfers_) {
      wake = std::min({wake, t->request.deadline, t->cancel_force_at});
    }
    const int timeout_ms =
        closing ? 1
                : static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(wake - now) + 1));
    epoll_wait(epoll_fd_, events, 2, timeout_ms);
    last_busy = absl::Now() - kSpin;  // poll once after a wake-up, then sleep again if idle
  }
}

absl::StatusOr<LocalRegion> UcxTransport::Map(MemorySpan span, bool allocate) {
  if (!allocate && (span.address == nullptr || span.length == 0)) {
    return absl::InvalidArgumentError("cannot register an empty span");
  }
  absl::Status status;
  ucp_mem_h memh = nullptr;
  std::string key;
  uint64_t secret = 0;
  MemorySpan mapped = span;
  RunSync([&] {
    ucp_mem_map_params_t params = {};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    params.address = allocate ? nullptr : span.address;
    params.length = span.length;
    params.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
    ucs_status_t s = ucp_mem_map(context_, &params, &memh);
    if (s != UCS_OK) {
      status = UcsError(allocate ? "ucp_mem_map (allocate)" : "ucp_mem_map (register)", s);
      return;
    }
    ucp_mem_attr_t attr = {};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    s = ucp_mem_query(memh, &attr);
    if (s != UCS_OK) {
      status = UcsError("ucp_mem_query", s);
      ucp_mem_unmap(context_, memh);
      return;
    }
    mapped = {attr.address, allocate ? span.length : attr.length};
    void* packed = nullptr;
    size_t packed_size = 0;
    s = ucp_rkey_pack(context_, memh, &packed, &packed_size);
    if (s != UCS_OK) {
      status = UcsError("ucp_rkey_pack", s);
      ucp_mem_unmap(context_, memh);
      return;
    }
    secret = absl::Uniform<uint64_t>(bitgen_);
    std::string secret_bytes;
    AppendLe(&secret_bytes, secret, 8);
    key = absl::StrCat(kKeyMagic, secret_bytes,
                       absl::string_view(static_cast<char*>(packed), packed_size));
    ucp_rkey_buffer_release(packed);
  });
  if (!status.ok()) return status;
  if (allocate) std::memset(mapped.address, 0, mapped.length);
  const uint64_t start = reinterpret_cast<uint64_t>(mapped.address);
  LocalRegion local;
  {
    absl::MutexLock lock(&regions_mu_);
    // Regions may not overlap: a local address must name one registration.
    auto next = regions_.lower_bound(start);
    const bool overlaps = (next != regions_.end() && next->first < start + mapped.length) ||
                          (next != regions_.begin() &&
                           std::prev(next)->first + std::prev(next)->second.span.length > start);
    if (!overlaps) {
      Region region;
      region.id = next_region_id_++;
      region.span = mapped;
      region.memh = memh;
      region.allocated = allocate;
      region.secret = secret;
      region.local.id = region.id;
      region.local.span = mapped;
      region.local.descriptor = {start, mapped.length, key};
      local = region.local;
      regions_[start] = std::move(region);
      region_bytes_ += mapped.length;
      metrics_.SetRegistered("ucx", static_cast<int64_t>(regions_.size()), region_bytes_);
      return local;
    }
  }
  RunSync([&] { ucp_mem_unmap(context_, memh); });
  return absl::AlreadyExistsError("the span overlaps a region already registered");
}

absl::StatusOr<LocalRegion> UcxTransport::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  return Map({nullptr, bytes}, true);
}

absl::Status UcxTransport::Deregister(RegionId id) {
  ucp_mem_h memh = nullptr;
  {
    absl::MutexLock lock(&regions_mu_);
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [&](const auto& entry) { return entry.second.id == id; });
    if (it == regions_.end()) {
      return absl::NotFoundError(absl::StrCat("no registered region ", id));
    }
    if (it->second.in_use > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region ", id, " is in use by ", it->second.in_use, " transfer(s) posted here"));
    }
    if (it->second.serving > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("region ", id, " is being read by ", it->second.serving, " peer get(s)"));
    }
    memh = it->second.memh;
    region_bytes_ -= it->second.span.length;
    regions_.erase(it);
    metrics_.SetRegistered("ucx", static_cast<int64_t>(regions_.size()), region_bytes_);
  }
  RunSync([&] { ucp_mem_unmap(context_, memh); });
  return absl::OkStatus();
}

int64_t UcxTransport::registered_regions() const {
  absl::MutexLock lock(&regions_mu_);
  return static_cast<int64_t>(regions_.size());
}

absl::StatusOr<PeerId> UcxTransport::Connect(absl::string_view address) {
  if (!absl::StartsWith(address, kAddressMagic) ||
      address.size() <= kAddressMagic.size() + kIdentityBytes) {
    return absl::InvalidArgumentError("not a UCX KV transport address");
  }
  {
    absl::MutexLock lock(&peers_mu_);
    for (const auto& [id, info] : peer_info_) {
      if (info.address == address && !info.failed) return id;
    }
  }
  const ProcessIdentity identity = DecodeIdentity(address.substr(kAddressMagic.size()));
  const std::string worker_address(address.substr(kAddressMagic.size() + kIdentityBytes));
  // A peer on this host (same boot, same pid namespace) is watched through a pidfd.
  int pidfd = -1;
  if (identity.boot_id == self_.boot_id && identity.pid_namespace == self_.pid_namespace &&
      identity.pid != 0) {
    pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(identity.pid), 0));
    if (pidfd >= 0 && ProcessStartTime(identity.pid) != identity.start_time) {
      close(pidfd);
      return absl::UnavailableError(absl::StrCat("peer process ", identity.pid, " has exited"));
    }
    if (pidfd < 0 && errno == ESRCH) {
      return absl::UnavailableError(absl::StrCat("peer process ", identity.pid, " has exited"));
    }
  }
  absl::Status status;
  PeerId id = 0;
  RunSync([&] {
    if (in_worker_progress_) {
      // From inside a UCX callback: UCX 1.13's tcp transport can hand the new endpoint the
      // connection whose messages it is delivering, mid-buffer, and then crash (see OnAm).
      status = absl::InternalError("Connect from inside ucp_worker_progress");
      LOG(ERROR) << "KV transport: " << status.message();
      return;
    }
    auto peer = std::make_unique<Peer>();
    ucp_ep_params_t params = {};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxTransport::OnError;
    params.err_handler.arg = this;
    t_expect_no_peer_failure_handler = pidfd >= 0;
    ucs_status_t s = ucp_ep_create(worker_, &params, &peer->ep);
    t_expect_no_peer_failure_handler = false;
    bool peer_errors = true;
    if (s == UCS_ERR_UNREACHABLE && pidfd >= 0) {
      // UCX 1.13's shared-memory transports have no peer failure handling; on this host the
      // pidfd tells when the peer dies, and deadlines bound everything else.
      params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
      s = ucp_ep_create(worker_, &params, &peer->ep);
      peer_errors = false;
    }
    if (s != UCS_OK) {
      status = UcsError("ucp_ep_create", s);
      return;
    }
    const std::string transports = EndpointTransports(peer->ep);
    peer->label = absl::StrCat("ucx:", transports);
    peer->am_mode = !HasNativeRma(transports);
    {
      absl::MutexLock lock(&peers_mu_);
      id = next_peer_id_++;
      peer_info_[id] = PeerInfo{std::string(address), peer->label, false};
    }
    peer->id = id;
    if (pidfd >= 0) {
      peer->pidfd = pidfd;
      pidfd = -1;
      epoll_event event = {};
      event.events = EPOLLIN;
      event.data.u64 = id;
      epoll_ctl(exit_epoll_fd_, EPOLL_CTL_ADD, peer->pidfd, &event);
    }
    LOG(INFO) << "KV transport: peer " << id << " connected via " << peer->label
              << (peer->am_mode ? ", data as active messages (no native RMA)" : ", native RMA")
              << (peer_errors ? " (peer error handling)"
                              : " (no UCX peer error handling on these transports: process exit "
                                "watched, deadlines bound the rest)");
    peers_[id] = std::move(peer);
  });
  if (pidfd >= 0) close(pidfd);
  if (!status.ok()) return status;
  return id;
}

void UcxTransport::Disconnect(PeerId id) {
  RunSync([&] {
    Peer* peer = FindPeer(id);
    if (peer != nullptr) FailPeer(peer, absl::CancelledError("peer disconnected"), false);
  });
}

std::string UcxTransport::PeerTransport(PeerId peer) const {
  absl::MutexLock lock(&peers_mu_);
  auto it = peer_info_.find(peer);
  return it == peer_info_.end() ? "" : it->second.label;
}

UcxTransport::Peer* UcxTransport::FindPeer(PeerId id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second.get();
}

absl::StatusOr<TransferId> UcxTransport::Post(TransferRequest request, DoneCallback done) {
  if (absl::Status s = ValidateTransferRequest(request); !s.ok()) return s;
  if (!absl::StartsWith(request.remote.remote_key, kKeyMagic) ||
      request.remote.remote_key.size() <= kKeyMagic.size() + 8) {
    return absl::InvalidArgumentError("remote key is not a UCX KV transport key");
  }
  std::string label;
  {
    absl::MutexLock lock(&peers_mu_);
    auto it = peer_info_.find(request.peer);
    if (it == peer_info_.end()) {
      return absl::NotFoundError(absl::StrCat("no peer ", request.peer));
    }
    if (it->second.failed) {
      return absl::UnavailableError(
          absl::StrCat("peer ", request.peer, " failed; Connect again to make a new connection"));
    }
    label = it->second.label;
  }
  auto t = std::make_unique<Transfer>();
  t->label = std::move(label);
  t->memhs.reserve(request.segments.size());
  {
    absl::MutexLock lock(&regions_mu_);
    std::vector<Region*> used;
    for (size_t i = 0; i < request.segments.size(); ++i) {
      const TransferSegment& s = request.segments[i];
      auto it = regions_.upper_bound(s.local_address);
      Region* region = nullptr;
      if (it != regions_.begin()) {
        Region& candidate = std::prev(it)->second;
        const uint64_t begin = reinterpret_cast<uint64_t>(candidate.span.address);
        if (s.local_address - begin <= candidate.span.length &&
            s.length <= candidate.span.length - (s.local_address - begin)) {
          region = &candidate;
        }
      }
      if (region == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "segment ", i, "'s local range is not inside a region registered with this transport"));
      }
      t->memhs.push_back(region->memh);
      if (std::find(used.begin(), used.end(), region) == used.end()) used.push_back(region);
    }
    for (Region* region : used) {
      ++region->in_use;
      t->pinned.push_back(region->id);
    }
  }
  t->owner = this;
  t->id = next_transfer_id_.fetch_add(1);
  t->token = token_salt_ ^ t->id;
  t->secret = ReadLe(request.remote.remote_key, kKeyMagic.size(), 8);
  for (const TransferSegment& s : request.segments) t->bytes += s.length;
  t->request = std::move(request);
  t->done = std::move(done);
  t->start = absl::Now();
  const TransferId id = t->id;
  Enqueue([this, t = t.release()]() mutable {
    std::unique_ptr<Transfer> owned(t);
    Peer* peer = FindPeer(t->request.peer);
    if (peer == nullptr || peer->failed || stopping_) {
      t->status = stopping_
                      ? absl::CancelledError("KV transport is shutting down")
                      : absl::UnavailableError(absl::StrCat(
                            "peer ", t->request.peer,
                            " failed: ", peer == nullptr ? "gone" : peer->failure.ToString()));
      t->phase = Phase::kDone;
      transfers_[t->id] = std::move(owned);
      Finish(t);
      return;
    }
    t->peer = peer;
    peer->transfers.insert(t);
    transfers_[t->id] = std::move(owned);
    if (absl::Now() >= t->request.deadline) {
      t->status = absl::DeadlineExceededError(
          absl::StrCat("transfer ", t->id, "'s deadline passed before it started"));
      t->phase = Phase::kDone;
      Finish(t);
      return;
    }
    Pump(t);
  });
  return id;
}

void UcxTransport::Cancel(TransferId id) {
  Enqueue([this, id] {
    auto it = transfers_.find(id);
    if (it == transfers_.end()) return;
    Transfer* t = it->second.get();
    if (t->phase == Phase::kDone || t->cancelled) return;
    t->cancelled = true;
    if (t->status.ok())
      t->status = absl::CancelledError(absl::StrCat("transfer ", id, " cancelled"));
    t->cancel_force_at = absl::Now() + options_.cancel_grace;
    Advance(t);
  });
}

absl::StatusOr<ucp_rkey_h> UcxTransport::RemoteKey(Peer* peer, const RegionDescriptor& region) {
  const std::string& key = region.remote_key;
  auto it = peer->rkeys.find(key);
  if (it != peer->rkeys.end()) return it->second.first;
  ucp_rkey_h rkey = nullptr;
  const ucs_status_t s = ucp_ep_rkey_unpack(peer->ep, key.data() + kKeyMagic.size() + 8, &rkey);
  if (s != UCS_OK) return UcsError("ucp_ep_rkey_unpack", s);
  // Populated only where UCX maps the whole region, contiguously (its last byte checked too: a
  // descriptor's length is the peer's word).
  uint64_t ticket = 0;
  void* mapped = nullptr;
  void* last = nullptr;
  if (region.length > 0 && ucp_rkey_ptr(rkey, region.address, &mapped) == UCS_OK &&
      mapped != nullptr &&
      ucp_rkey_ptr(rkey, region.address + region.length - 1, &last) == UCS_OK &&
      static_cast<char*>(last) == static_cast<char*>(mapped) + region.length - 1) {
    ticket = populator_.Add(mapped, region.length);
  }
  peer->rkeys[key] = {rkey, ticket};
  return rkey;
}

void UcxTransport::OnOpDone(void* request, ucs_status_t status, void* user_data) {
  auto* t = static_cast<Transfer*>(user_data);
  --t->inflight;
  if (status != UCS_OK && t->status.ok()) {
    t->status =
        UcsError(absl::StrCat("transfer ", t->id, " ",
                              t->phase == Phase::kFlushing    ? "flush"
                              : t->phase == Phase::kNotifying ? "notification"
                                                              : TransferOpName(t->request.op)),
                 status);
  }
  ucp_request_free(request);
  t->owner->touched_.push_back(t->id);
}

// Posts segments up to the in-flight limit, then moves the transfer through flush and
// notification; finishes it when nothing is in flight and nothing is left to do.
void UcxTransport::Pump(Transfer* t) {
  if (t->peer != nullptr && t->peer->am_mode) {
    PumpAm(t);
    return;
  }
  const bool put = t->request.op == TransferOp::kPut;
  if (t->rkey == nullptr && t->status.ok() && t->phase == Phase::kPosting) {
    absl::StatusOr<ucp_rkey_h> rkey = RemoteKey(t->peer, t->request.remote);
    if (rkey.ok()) {
      t->rkey = *rkey;
    } else {
      t->status = rkey.status();
    }
  }
  while (t->status.ok() && t->phase == Phase::kPosting && t->next < t->request.segments.size() &&
         t->inflight < kMaxInflightOps) {
    const size_t i = t->next++;
    const TransferSegment& s = t->request.segments[i];
    ucp_request_param_t param = {};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH;
    param.cb.send = &UcxTransport::OnOpDone;
    param.user_data = t;
    param.memh = t->memhs[i];
    void* local = reinterpret_cast<void*>(s.local_address);
    ucs_status_ptr_t p =
        put ? ucp_put_nbx(t->peer->ep, local, s.length, s.remote_address, t->rkey, &param)
            : ucp_get_nbx(t->peer->ep, local, s.length, s.remote_address, t->rkey, &param);
    if (UCS_PTR_IS_ERR(p)) {
      t->status = UcsError(absl::StrCat("transfer ", t->id, " ", TransferOpName(t->request.op)),
                           UCS_PTR_STATUS(p));
    } else if (p != nullptr) {
      ++t->inflight;
    }
  }
  Advance(t);
}

void UcxTransport::Advance(Transfer* t) {
  if (t->peer != nullptr && t->peer->am_mode) {
    AdvanceAm(t);
    return;
  }
  if (t->phase == Phase::kDone || t->inflight > 0) return;
  if (t->status.ok() && t->phase == Phase::kPosting) {
    if (t->next < t->request.segments.size()) return;  // Pump posts the rest
    if (t->request.op == TransferOp::kPut) {
      // Puts complete locally when their source may be reused; the flush completes when they
      // are in the peer's memory.
      t->phase = Phase::kFlushing;
      ucp_request_param_t param = {};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.send = &UcxTransport::OnOpDone;
      param.user_data = t;
      ucs_status_ptr_t p = ucp_ep_flush_nbx(t->peer->ep, &param);
      if (UCS_PTR_IS_ERR(p)) {
        t->status = UcsError(absl::StrCat("transfer ", t->id, " flush"), UCS_PTR_STATUS(p));
      } else if (p != nullptr) {
        ++t->inflight;
        return;
      }
    } else {
      t->phase = Phase::kFlushing;
    }
  }
  if (t->phase == Phase::kPosting || t->phase == Phase::kFlushing) {
    // Done moving bytes (or failed): tell the owner, if it waits for this transfer.
    t->phase = Phase::kNotifying;
    if (!t->request.transfer_id.empty() && t->peer != nullptr && !t->peer->failed) {
      SendNotification(t);
      if (t->inflight > 0) return;
    }
  }
  t->phase = Phase::kDone;
  Finish(t);
}

void UcxTransport::SendNotification(Transfer* t) {
  t->notify_payload = EncodeNotification(t->request.transfer_id, t->status);
  t->control = AmHeader{static_cast<uint32_t>(AmType::kNotify), 0, t->token, 0, 0};
  ucp_request_param_t param = {};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = &UcxTransport::OnOpDone;
  param.user_data = t;
  const bool was_ok = t->status.ok();
  ucs_status_ptr_t p = ucp_am_send_nbx(t->peer->ep, kFerryAmId, &t->control, sizeof(AmHeader),
                                       t->notify_payload.data(), t->notify_payload.size(), &param);
  if (UCS_PTR_IS_ERR(p)) {
    if (was_ok) {
      t->status = UcsError(absl::StrCat("transfer ", t->id, " notification"), UCS_PTR_STATUS(p));
    }
  } else if (p != nullptr) {
    ++t->inflight;
  }
}

// --- The active-message protocol ----------------------------------------------------------------
//
// Puts: the initiator sends the data as kPutData messages of at most kAmChunkBytes (each names
// the remote address and the region's secret; the owner checks both, then copies the data into
// place with streaming stores, streaming_copy.h), then kPutCommit with the byte count, its
// outcome and its own address. The owner, once
// every byte has arrived, tells its AwaitNotification and answers kPutAck over its own connection
// to the initiator; the initiator's transfer completes with the ack. Gets: kGetRequest names the
// ranges; the owner checks them all, sends kGetData messages straight from its registered memory
// and then kGetDone, and tells its AwaitNotification; the initiator copies each chunk into the
// segment it names and completes when kGetDone has come and every byte with it. The owner never
// writes or reads outside a region whose secret the message carries.
//
// The owner connects to the initiator (ReplyPeer) and sends its replies only after
// ucp_worker_progress has returned, never from the message's callback: UCX 1.13's tcp transport
// pairs a new endpoint with a connection the peer opened to it (same address and sequence number)
// by moving that connection's receive buffer to the new endpoint. Done from inside the callback
// while messages that came after the current one are still in that buffer, the receive loop it
// returns to finds its buffer gone and frees a null one (SIGSEGV in uct_tcp_ep_progress_am_rx).

ucs_status_ptr_t UcxTransport::SendAm(Peer* peer, AmOp* op, const void* data, size_t length,
                                      ucp_mem_h memh) {
  ucp_request_param_t param = {};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_EAGER;
  param.cb.send = &UcxTransport::OnAmOpDone;
  param.user_data = op;
  if (memh != nullptr) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = memh;
  }
  return ucp_am_send_nbx(peer->ep, kFerryAmId, &op->header, sizeof(AmHeader), data, length, &param);
}

void UcxTransport::SendOneWay(Peer* peer, const AmHeader& header, std::string payload) {
  auto* op = new AmOp;
  op->owner = this;
  op->header = header;
  op->payload = std::move(payload);
  ucs_status_ptr_t p = SendAm(peer, op, op->payload.data(), op->payload.size(), nullptr);
  if (UCS_PTR_IS_ERR(p)) {
    LOG(WARNING) << "KV transport: reply to peer " << peer->id
                 << " failed: " << ucs_status_string(UCS_PTR_STATUS(p));
  }
  if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
}

void UcxTransport::OnAmOpDone(void* request, ucs_status_t status, void* user_data) {
  auto* op = static_cast<AmOp*>(user_data);
  UcxTransport* self = op->owner;
  if (op->transfer != 0) {
    auto it = self->transfers_.find(op->transfer);
    if (it != self->transfers_.end()) {
      Transfer* t = it->second.get();
      --t->inflight;
      if (status != UCS_OK && t->status.ok()) {
        t->status =
            UcsError(absl::StrCat("transfer ", t->id, " ", TransferOpName(t->request.op)), status);
      }
      self->touched_.push_back(t->id);
    }
  } else if (op->serve != 0) {
    auto it = self->serves_.find(op->serve);
    if (it != self->serves_.end()) {
      Serve* serve = it->second.get();
      --serve->inflight;
      if (status != UCS_OK && serve->status.ok()) {
        serve->status = UcsError("serving a get", status);
      }
      self->touched_serves_.push_back(serve->token);
    }
  }
  ucp_request_free(request);
  delete op;
}

void UcxTransport::PumpAm(Transfer* t) {
  const bool put = t->request.op == TransferOp::kPut;
  if (put) {
    while (t->status.ok() && t->phase == Phase::kPosting && t->next < t->request.segments.size() &&
           t->inflight < kMaxInflightOps) {
      const TransferSegment& s = t->request.segments[t->next];
      const uint64_t length = std::min<uint64_t>(kAmChunkBytes, s.length - t->seg_offset);
      auto* op = new AmOp;
      op->owner = this;
      op->transfer = t->id;
      op->header = AmHeader{static_cast<uint32_t>(AmType::kPutData), 0, t->token,
                            s.remote_address + t->seg_offset, t->secret};
      ucs_status_ptr_t p =
          SendAm(t->peer, op, reinterpret_cast<const void*>(s.local_address + t->seg_offset),
                 length, t->memhs[t->next]);
      if (UCS_PTR_IS_ERR(p)) {
        t->status = UcsError(absl::StrCat("transfer ", t->id, " put"), UCS_PTR_STATUS(p));
      } else if (p != nullptr) {
        ++t->inflight;
      }
      if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
      t->seg_offset += length;
      if (t->seg_offset == s.length) {
        ++t->next;
        t->seg_offset = 0;
      }
    }
  } else if (t->status.ok() && t->phase == Phase::kPosting) {
    // One request names every range; the data comes back as kGetData.
    std::string payload;
    AppendLe(&payload, address_.size(), 4);
    payload += address_;
    AppendLe(&payload, t->request.transfer_id.size(), 4);
    payload += t->request.transfer_id;
    for (const TransferSegment& s : t->request.segments) {
      AppendLe(&payload, s.remote_address, 8);
      AppendLe(&payload, s.length, 8);
    }
    auto* op = new AmOp;
    op->owner = this;
    op->transfer = t->id;
    op->header = AmHeader{static_cast<uint32_t>(AmType::kGetRequest), 0, t->token, 0, t->secret};
    op->payload = std::move(payload);
    ucs_status_ptr_t p = SendAm(t->peer, op, op->payload.data(), op->payload.size(), nullptr);
    if (UCS_PTR_IS_ERR(p)) {
      t->status = UcsError(absl::StrCat("transfer ", t->id, " get request"), UCS_PTR_STATUS(p));
    } else if (p != nullptr) {
      ++t->inflight;
    }
    if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
    t->next = t->request.segments.size();
  }
  AdvanceAm(t);
}

void UcxTransport::AdvanceAm(Transfer* t) {
  if (t->phase == Phase::kDone || t->inflight > 0) return;
  const bool put = t->request.op == TransferOp::kPut;
  if (t->phase == Phase::kPosting) {
    if (t->status.ok() && t->next < t->request.segments.size()) return;  // PumpAm sends the rest
    if (put && !t->peer->failed) {
      // The commit: the owner acknowledges once every byte is in place (or reports why not).
      std::string payload;
      AppendLe(&payload, address_.size(), 4);
      payload += address_;
      payload += EncodeNotification(t->request.transfer_id, t->status);
      auto* op = new AmOp;
      op->owner = this;
      op->transfer = t->id;
      op->header = AmHeader{static_cast<uint32_t>(AmType::kPutCommit),
                            static_cast<uint32_t>(t->status.code()), t->token, t->bytes, 0};
      op->payload = std::move(payload);
      ucs_status_ptr_t p = SendAm(t->peer, op, op->payload.data(), op->payload.size(), nullptr);
      if (UCS_PTR_IS_ERR(p) && t->status.ok()) {
        t->status = UcsError(absl::StrCat("transfer ", t->id, " commit"), UCS_PTR_STATUS(p));
      } else if (p != nullptr && !UCS_PTR_IS_ERR(p)) {
        ++t->inflight;
      }
      if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
    }
    t->phase = Phase::kAwaitingPeer;
    if (t->inflight > 0) return;
  }
  if (t->phase == Phase::kAwaitingPeer) {
    // Wait for the owner unless the transfer already failed here (the owner learns from the
    // commit, or from its own deadline).
    const bool complete = t->peer_done && (put || t->received == t->bytes);
    if (t->status.ok() && !complete) return;
  }
  t->phase = Phase::kDone;
  Finish(t);
}

absl::StatusOr<UcxTransport::Region*> UcxTransport::RemoteAccess(uint64_t address, uint64_t length,
                                                                 uint64_t secret) {
  auto it = regions_.upper_bound(address);
  if (it == regions_.begin()) {
    return absl::OutOfRangeError("the range is not inside a registered region");
  }
  Region& region = std::prev(it)->second;
  const uint64_t begin = reinterpret_cast<uint64_t>(region.span.address);
  if (address - begin > region.span.length || length > region.span.length - (address - begin)) {
    return absl::OutOfRangeError("the range is not inside a registered region");
  }
  if (region.secret != secret) {
    return absl::PermissionDeniedError("the key does not match the region");
  }
  return &region;
}

absl::StatusOr<UcxTransport::Peer*> UcxTransport::ReplyPeer(const std::string& address) {
  absl::Status last;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<PeerId> id = Connect(address);
    if (!id.ok()) return id.status();
    Peer* p = FindPeer(*id);
    if (p != nullptr && !p->failed) return p;
    last = p == nullptr ? absl::UnavailableError(absl::StrCat("connection ", *id, " is gone"))
                        : p->failure;
    // Make sure the next Connect makes a new connection.
    absl::MutexLock lock(&peers_mu_);
    auto it = peer_info_.find(*id);
    if (it != peer_info_.end()) it->second.failed = true;
  }
  return last;
}

void UcxTransport::OnPutData(const AmHeader& h, absl::string_view data) {
  IncomingPut& in = incoming_puts_[h.token];
  if (in.expires == absl::Time()) in.expires = absl::Now() + options_.early_notification_ttl;
  if (!in.status.ok()) return;
  {
    absl::MutexLock lock(&regions_mu_);
    absl::StatusOr<Region*> region = RemoteAccess(h.a, data.size(), h.b);
    if (region.ok()) {
      StreamingCopy(reinterpret_cast<void*>(h.a), data.data(), data.size());
      in.received += data.size();
    } else {
      in.status = region.status();
      LOG(WARNING) << "KV transport: refused " << data.size() << " bytes at "
                   << absl::StrCat("0x", absl::Hex(h.a)) << ": " << region.status();
    }
  }
  // Data that overtook its commit on another lane: the commit waited for it.
  if (in.committed && (in.received >= in.total || !in.status.ok())) FinalizePut(h.token, in);
}

void UcxTransport::OnPutCommit(const AmHeader& h, absl::string_view data) {
  if (data.size() < 4) return;
  const uint64_t address_length = ReadLe(data, 0, 4);
  if (data.size() < 4 + address_length) return;
  std::string transfer_id;
  absl::Status outcome;
  if (!DecodeNotification(data.substr(4 + address_length), &transfer_id, &outcome)) return;
  IncomingPut& in = incoming_puts_[h.token];
  in.committed = true;
  in.total = h.a;
  in.outcome = std::move(outcome);
  in.transfer_id = std::move(transfer_id);
  in.initiator = std::string(data.substr(4, address_length));
  in.expires = absl::Now() + options_.early_notification_ttl;
  if (in.received >= in.total || !in.status.ok() || !in.outcome.ok()) FinalizePut(h.token, in);
}

void UcxTransport::FinalizePut(uint64_t token, IncomingPut& in) {
  absl::Status status =
      !in.outcome.ok()  ? in.outcome
      : !in.status.ok() ? in.status
      : in.received == in.total
          ? absl::OkStatus()
          : absl::DataLossError(absl::StrCat("received ", in.received, " of ", in.total, " bytes"));
  if (!in.transfer_id.empty()) board_.Deliver(in.transfer_id, status);
  if (in.outcome.ok()) {
    // The initiator waits for the acknowledgement; it leaves once ucp_worker_progress returns.
    pending_acks_.push_back(PendingAck{std::move(in.initiator),
                                       AmHeader{static_cast<uint32_t>(AmType::kPutAck),
                                                static_cast<uint32_t>(status.code()), token, 0, 0},
                                       std::string(status.message())});
  }
  incoming_puts_.erase(token);
}

void UcxTransport::SendPendingAcks() {
  std::vector<PendingAck> acks;
  acks.swap(pending_acks_);
  if (stopping_) return;  // shutting down: nothing is acknowledged
  for (PendingAck& ack : acks) {
    absl::StatusOr<Peer*> peer = ReplyPeer(ack.initiator);
    if (!peer.ok()) {
      LOG(WARNING) << "KV transport: cannot acknowledge a put: " << peer.status();
      continue;
    }
    SendOneWay(*peer, ack.header, std::move(ack.message));
  }
}

void UcxTransport::ExpireIncoming(absl::Time now) {
  for (auto it = incoming_puts_.begin(); it != incoming_puts_.end();) {
    if (it->second.expires <= now) {
      IncomingPut& in = it->second;
      LOG(WARNING) << "KV transport: dropped an incomplete incoming put (" << in.received
                   << " bytes, " << (in.committed ? "committed" : "never committed") << ")";
      if (in.committed && !in.transfer_id.empty()) {
        board_.Deliver(in.transfer_id, absl::DataLossError(absl::StrCat(
                                           "received ", in.received, " of ", in.total, " bytes")));
      }
      it = incoming_puts_.erase(it);
    } else {
      ++it;
    }
  }
}

void UcxTransport::OnGetRequest(const AmHeader& h, absl::string_view data) {
  auto serve = std::make_unique<Serve>();
  serve->token = h.token;
  // Parse: address, transfer id, ranges.
  if (data.size() < 4) return;
  const uint64_t address_length = ReadLe(data, 0, 4);
  if (data.size() < 8 + address_length) return;
  const std::string initiator(data.substr(4, address_length));
  const uint64_t id_length = ReadLe(data, 4 + address_length, 4);
  size_t at = 8 + address_length;
  if (id_length > kMaxTransferIdBytes || data.size() < at + id_length) return;
  serve->transfer_id = std::string(data.substr(at, id_length));
  at += id_length;
  if ((data.size() - at) % 16 != 0) return;
  if (serves_.count(h.token) != 0) {
    LOG(WARNING) << "KV transport: dropped a get request for a get already being served";
    return;
  }
  serve->initiator = initiator;
  {
    absl::MutexLock lock(&regions_mu_);
    Region* region = nullptr;
    for (; at < data.size(); at += 16) {
      const uint64_t address = ReadLe(data, at, 8), length = ReadLe(data, at + 8, 8);
      absl::StatusOr<Region*> r = RemoteAccess(address, length, h.b);
      if (!r.ok() || (region != nullptr && *r != region)) {
        serve->status =
            r.ok() ? absl::InvalidArgumentError("ranges span several regions") : r.status();
        serve->ranges.clear();
        break;
      }
      region = *r;
      serve->ranges.emplace_back(address, length);
    }
    if (serve->status.ok() && region != nullptr) {
      ++region->serving;
      serve->region = region->id;
      serve->memh = region->memh;
    }
  }
  serves_[h.token] = std::move(serve);
  // Connected to and served once ucp_worker_progress returns.
  touched_serves_.push_back(h.token);
}

void UcxTransport::PumpServe(Serve* serve) {
  if (serve->peer == 0) {
    // The first pump (never inside ucp_worker_progress): the connection to the initiator, which
    // also carries the completion of a get OnGetRequest refused.
    if (stopping_) {
      serve->status = absl::CancelledError("KV transport is shutting down");
    } else if (absl::StatusOr<Peer*> p = ReplyPeer(serve->initiator); p.ok()) {
      serve->peer = (*p)->id;
    } else {
      LOG(WARNING) << "KV transport: cannot serve a get: " << p.status();
      serve->status =
          absl::UnavailableError(absl::StrCat("initiator unreachable: ", p.status().message()));
    }
  }
  Peer* peer = FindPeer(serve->peer);
  if (peer == nullptr || peer->failed) {
    if (serve->status.ok()) serve->status = absl::UnavailableError("initiator failed");
  }
  while (serve->status.ok() && serve->next < serve->ranges.size() &&
         serve->inflight < kMaxInflightOps) {
    const auto [address, length] = serve->ranges[serve->next];
    const uint64_t chunk = std::min<uint64_t>(kAmChunkBytes, length - serve->offset);
    auto* op = new AmOp;
    op->owner = this;
    op->serve = serve->token;
    op->header = AmHeader{static_cast<uint32_t>(AmType::kGetData), 0, serve->token, serve->next,
                          serve->offset};
    ucs_status_ptr_t p = SendAm(peer, op, reinterpret_cast<const void*>(address + serve->offset),
                                chunk, serve->memh);
    if (UCS_PTR_IS_ERR(p)) {
      serve->status = UcsError("serving a get", UCS_PTR_STATUS(p));
    } else if (p != nullptr) {
      ++serve->inflight;
    }
    if (p == nullptr || UCS_PTR_IS_ERR(p)) delete op;
    serve->offset += chunk;
    if (serve->offset == length) {
      ++serve->next;
      serve->offset = 0;
    }
  }
  if (serve->inflight > 0) return;
  if (serve->status.ok() && serve->next < serve->ranges.size()) return;
  // Every chunk has left (or the get failed): tell the initiator and the owner's await.
  if (peer != nullptr && !peer->failed) {
    SendOneWay(peer,
               AmHeader{static_cast<uint32_t>(AmType::kGetDone),
                        static_cast<uint32_t>(serve->status.code()), serve->token, 0, 0},
               std::string(serve->status.message()));
  }
  if (!serve->transfer_id.empty()) board_.Deliver(serve->transfer_id, serve->status);
  if (serve->region != 0) {
    absl::MutexLock lock(&regions_mu_);
    for (auto& [start, region] : regions_) {
      if (region.id == serve->region) --region.serving;
    }
  }
  serves_.erase(serve->token);
}

void UcxTransport::OnReply(const AmHeader& h, absl::string_view data) {
  auto it = transfers_.find(h.token ^ token_salt_);
  if (it == transfers_.end()) return;  // finished already (failed, cancelled): late data dropped
  Transfer* t = it->second.get();
  if (t->phase == Phase::kDone) return;
  const auto type = static_cast<AmType>(h.type);
  if (type == AmType::kGetData) {
    if (t->request.op != TransferOp::kGet || h.a >= t->request.segments.size()) return;
    const TransferSegment& s = t->request.segments[h.a];
    if (h.b > s.length || data.size() > s.length - h.b) {
      if (t->status.ok()) t->status = absl::DataLossError("get data outside its segment");
    } else if (t->status.ok()) {
      StreamingCopy(reinterpret_cast<void*>(s.local_address + h.b), data.data(), data.size());
      t->received += data.size();
    }
  } else {
    t->peer_done = true;
    if (h.code != 0 && t->status.ok()) {
      t->status = absl::Status(static_cast<absl::StatusCode>(std::min<uint32_t>(h.code, 16)),
                               absl::StrCat("peer reports: ", data));
    }
  }
  touched_.push_back(t->id);
}

void UcxTransport::Finish(Transfer* t) {
  {
    absl::MutexLock lock(&regions_mu_);
    for (RegionId id : t->pinned) {
      for (auto& [address, region] : regions_) {
        if (region.id == id) {
          --region.in_use;
          break;
        }
      }
    }
  }
  if (t->peer != nullptr) t->peer->transfers.erase(t);
  metrics_.RecordTransfer(t->label, t->request.op, t->bytes, absl::Now() - t->start, t->status);
  auto owned = std::move(transfers_[t->id]);
  transfers_.erase(t->id);
  DoneCallback done = std::move(t->done);
  absl::Status status = std::move(t->status);
  if (t->inflight > 0) {
    // Abandoned (see ReapPeers): UCX may still complete its requests, which name the object.
    orphans_.push_back(std::move(owned));
  }
  owned.reset();
  if (done) done(std::move(status));
}

void UcxTransport::CheckTimers(absl::Time now) {
  std::vector<Transfer*> due;
  for (auto& [id, t] : transfers_) due.push_back(t.get());
  for (Transfer* t : due) {
    if (transfers_.count(t->id) == 0) continue;  // finished by an earlier one's peer failure
    if (t->phase == Phase::kDone) continue;
    if (now >= t->request.deadline && !absl::IsDeadlineExceeded(t->status)) {
      if (t->status.ok() || absl::IsCancelled(t->status)) {
        t->status = absl::DeadlineExceededError(
            absl::StrCat("transfer ", t->id, " did not complete before its deadline (", t->next,
                         " of ", t->request.segments.size(), " segments posted, ", t->inflight,
                         " operations in flight)"));
      }
      // Nothing more is posted; what is in flight gets cancel_grace to come back before the
      // connection is forced closed (below).
      t->cancelled = true;
      t->cancel_force_at = std::min(t->cancel_force_at, now + options_.cancel_grace);
      Advance(t);
    } else if (t->cancelled && t->inflight > 0 && now >= t->cancel_force_at && t->peer != nullptr &&
               !t->peer->closed && t->peer->close_request == nullptr) {
      // Operations to a peer that stopped answering complete only when the endpoint goes.
      FailPeer(t->peer,
               absl::UnavailableError(absl::StrCat(
                   "connection closed: transfer ", t->id,
                   " still had operations in flight past its deadline or cancellation")),
               true);
    }
  }
}

void UcxTransport::FailPeer(Peer* peer, absl::Status status, bool force) {
  if (!peer->failed) {
    peer->failed = true;
    peer->failure = status;
    {
      absl::MutexLock lock(&peers_mu_);
      auto it = peer_info_.find(peer->id);
      if (it != peer_info_.end()) it->second.failed = true;
    }
    if (absl::IsCancelled(status)) {
      LOG(INFO) << "KV transport: closing peer " << peer->id << " (" << peer->label
                << "): " << status.message();
    } else {
      LOG(WARNING) << "KV transport: peer " << peer->id << " (" << peer->label
                   << ") failed: " << status;
    }
    const absl::Time force_at = absl::Now() + options_.cancel_grace;
    for (Transfer* t : peer->transfers) {
      if (t->status.ok()) t->status = status;
      t->cancelled = true;
      t->cancel_force_at = std::min(t->cancel_force_at, force_at);
    }
    peer->close_pending = true;
    peer->close_force_at = force_at;
  }
  if (force && peer->close_pending) CloseEndpoint(peer, true);
}

void UcxTransport::CloseEndpoint(Peer* peer, bool force) {
  peer->close_pending = false;
  ucp_request_param_t param = {};
  if (force) {
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  ucs_status_ptr_t p = ucp_ep_close_nbx(peer->ep, &param);
  if (UCS_PTR_IS_ERR(p) || p == nullptr) {
    peer->closed = true;
  } else {
    peer->close_request = p;
  }
}

// Frees peers whose forced close has completed and whose transfers have all finished.
void UcxTransport::ReapPeers() {
  const absl::Time now = absl::Now();
  for (auto it = peers_.begin(); it != peers_.end();) {
    Peer* peer = it->second.get();
    if (peer->close_pending) {
      bool quiet = true;
      for (Transfer* t : peer->transfers) quiet &= t->inflight == 0;
      for (const auto& [token, serve] : serves_) {
        if (serve->peer == peer->id) quiet &= serve->inflight == 0;
      }
      if (quiet || now >= peer->close_force_at) CloseEndpoint(peer, !quiet);
    }
    if (peer->close_request != nullptr &&
        ucp_request_check_status(peer->close_request) != UCS_INPROGRESS) {
      ucp_request_free(peer->close_request);
      peer->close_request = nullptr;
      peer->closed = true;
    }
    if (peer->closed && peer->closed_at == absl::InfinitePast()) peer->closed_at = now;
    if (peer->closed && !peer->transfers.empty() && now - peer->closed_at > kAbandonAfter) {
      // The endpoint is gone, yet operations on it never came back (seen on UCX 1.13's
      // shared-memory endpoints, which lack peer failure handling, when the peer was killed):
      // their transfers end now, with the peer's failure, instead of never.
      std::vector<Transfer*> stuck(peer->transfers.begin(), peer->transfers.end());
      for (Transfer* t : stuck) {
        LOG(WARNING) << "KV transport: transfer " << t->id << " abandoned with " << t->inflight
                     << " operations UCX never completed after its endpoint closed";
        if (t->status.ok()) t->status = peer->failure;
        t->phase = Phase::kDone;
        Finish(t);
      }
    }
    if (peer->closed && peer->transfers.empty()) {
      for (auto& [key, rkey] : peer->rkeys) {
        if (rkey.second != 0) populator_.Forget(rkey.second);  // before UCX unmaps it
        ucp_rkey_destroy(rkey.first);
      }
      if (peer->pidfd >= 0) {
        epoll_ctl(exit_epoll_fd_, EPOLL_CTL_DEL, peer->pidfd, nullptr);
        close(peer->pidfd);
      }
      {
        // Kept (failed) so that Post names the failure; the oldest go beyond kMaxFailedPeers.
        absl::MutexLock lock(&peers_mu_);
        failed_peers_.push_back(peer->id);
        while (failed_peers_.size() > kMaxFailedPeers) {
          peer_info_.erase(failed_peers_.front());
          failed_peers_.pop_front();
        }
      }
      it = peers_.erase(it);
    } else {
      // A failed peer's transfers finish as their operations come back.
      if (peer->failed) {
        std::vector<Transfer*> transfers(peer->transfers.begin(), peer->transfers.end());
        for (Transfer* t : transfers) Advance(t);
      }
      ++it;
    }
  }
}

void UcxTransport::CheckExits() {
  epoll_event events[16];
  const int n = epoll_wait(exit_epoll_fd_, events, 16, 0);
  for (int i = 0; i < n; ++i) {
    Peer* peer = FindPeer(static_cast<PeerId>(events[i].data.u64));
    if (peer == nullptr) continue;
    epoll_ctl(exit_epoll_fd_, EPOLL_CTL_DEL, peer->pidfd, nullptr);
    FailPeer(peer,
             absl::UnavailableError(
                 absl::StrCat("peer ", peer->id, " (", peer->label, "): its process exited")),
             true);
  }
}

void UcxTransport::OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxTransport*>(arg);
  for (auto& [id, peer] : self->peers_) {
    if (peer->ep == ep) {
      // UCX wants a failed endpoint closed forcibly.
      self->FailPeer(peer.get(),
                     UcsError(absl::StrCat("peer ", id, " (", peer->label, ")"), status), true);
      return;
    }
  }
}

// Runs inside ucp_worker_progress. What it starts that needs a connection to the sender (a put's
// acknowledgement, a get's data and completion) waits until ucp_worker_progress has returned: a
// connection made from here can crash UCX 1.13's tcp transport (see "The active-message protocol").
ucs_status_t UcxTransport::OnAm(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  if (self->stopping_) return UCS_OK;  // shutting down: nothing is served or acknowledged
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0 || header_length != sizeof(AmHeader)) {
    // Every Ferry message is sent eagerly with an AmHeader.
    LOG(WARNING) << "KV transport: dropped a malformed message (" << length << " bytes)";
    return UCS_OK;
  }
  AmHeader h;
  std::memcpy(&h, header, sizeof(h));
  const absl::string_view bytes(static_cast<const char*>(data), length);
  switch (static_cast<AmType>(h.type)) {
    case AmType::kNotify: {
      std::string transfer_id;
      absl::Status status;
      if (DecodeNotification(bytes, &transfer_id, &status)) {
        self->board_.Deliver(transfer_id, std::move(status));
      }
      break;
    }
    case AmType::kPutData:
      self->OnPutData(h, bytes);
      break;
    case AmType::kPutCommit:
      self->OnPutCommit(h, bytes);
      break;
    case AmType::kGetRequest:
      self->OnGetRequest(h, bytes);
      break;
    case AmType::kPutAck:
    case AmType::kGetData:
    case AmType::kGetDone:
      self->OnReply(h, bytes);
      break;
    default:
      LOG(WARNING) << "KV transport: dropped a message of unknown type " << h.type;
  }
  return UCS_OK;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> NewUcxTransport(const TransportOptions& options) {
  auto transport = std::make_unique<UcxTransport>(options);
  if (absl::Status s = transport->Init(); !s.ok()) return s;
  return transport;
}

}  // namespace transfer
}  // namespace ferry
