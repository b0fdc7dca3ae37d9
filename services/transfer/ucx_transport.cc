#include "services/transfer/ucx_transport.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
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
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/common/log.h"
#include "services/transfer/ucx_peer.h"
#include "services/transfer/ucx_transport_internal.h"
#include "services/transfer/ucx_wire.h"

namespace ferry {
namespace transfer {
namespace ucx_internal {
namespace {

// After the last event the progress thread polls this long before it sleeps.
constexpr absl::Duration kSpin = absl::Milliseconds(2);

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

}  // namespace

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
  // Large puts from peers without native RMA arrive on connections of this listener, read
  // straight into place (ucx_data_socket.h); without it they come as active messages.
  DataListener::Sink sink;
  sink.begin = [this](const DataFrameHeader& h) { return OnDataBegin(h); };
  sink.end = [this](const DataFrameHeader& h, uint64_t region, uint64_t received, absl::Status s) {
    OnDataEnd(h, region, received, std::move(s));
  };
  sink.commit = [this](const DataFrameHeader& h, std::string payload) {
    Enqueue([this, header = h.am, payload = std::move(payload)] { OnPutCommit(header, payload); });
  };
  sink.refused = [this](const DataFrameHeader& h, absl::Status s) {
    Enqueue([this, token = h.am.token, s = std::move(s)] { FailIncoming(token, s); });
  };
  absl::StatusOr<std::unique_ptr<DataListener>> listener = DataListener::Start(std::move(sink));
  if (listener.ok()) {
    data_listener_ = std::move(*listener);
  } else {
    LOG(WARNING) << "KV transport: no bulk-data listener (large puts from peers without native "
                    "RMA come as active messages): "
                 << listener.status();
  }
  address_ = absl::StrCat(
      kAddressMagic, EncodeIdentity(self_),
      EncodeDataEndpoint(data_listener_ != nullptr ? data_listener_->endpoint() : DataEndpoint{}),
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
  if (!thread_.joinable()) data_listener_.reset();  // Init failed
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
    // No frame is read into a region or written from one past here (the regions go below), and
    // no sink or sender callback runs.
    data_listener_.reset();
    for (auto& [id, peer] : peers_) peer->data.reset();
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
      // RDMA transports pin what they register: a locked-memory limit below the region is the
      // usual cause in a container (the runtime's default is a few MiB).
      struct rlimit memlock = {};
      if (getrlimit(RLIMIT_MEMLOCK, &memlock) == 0 && memlock.rlim_cur != RLIM_INFINITY &&
          memlock.rlim_cur < span.length) {
        status = absl::Status(
            status.code(),
            absl::StrCat(status.message(), " (the locked-memory limit, ulimit -l, is ",
                         memlock.rlim_cur, " bytes for a region of ", span.length,
                         ": RDMA pins registered memory; raise the container runtime's "
                         "LimitMEMLOCK or give the process CAP_IPC_LOCK)"));
      }
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
    if (it->second.receiving > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "region ", id, " is being written by ", it->second.receiving, " peer put receive(s)"));
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

}  // namespace ucx_internal

absl::StatusOr<std::unique_ptr<KvTransport>> NewUcxTransport(const TransportOptions& options) {
  auto transport = std::make_unique<ucx_internal::UcxTransport>(options);
  if (absl::Status s = transport->Init(); !s.ok()) return s;
  return transport;
}

}  // namespace transfer
}  // namespace ferry
