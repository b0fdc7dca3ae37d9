#include "services/transfer/ucx_peer.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/log.h"
#include "services/transfer/ucx_transport_internal.h"
#include "services/transfer/ucx_wire.h"

namespace ferry {
namespace transfer {
namespace ucx_internal {
namespace {

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

}  // namespace

__thread bool t_expect_no_peer_failure_handler = false;

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

bool ProcessGoneOrDying(uint32_t pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd p = {pidfd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) return true;  // exited
  }
  std::ifstream stat_in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(stat_in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return true;
  // After ")": field 3 (state), then field 9 (flags) at index 6.
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(paren + 1), ' ', absl::SkipEmpty());
  if (fields.size() < 7) return true;
  if (fields[0] == "Z" || fields[0] == "X" || fields[0] == "x") return true;
  constexpr uint64_t kPfExiting = 0x4;
  uint64_t flags = 0;
  if (absl::SimpleAtoi(fields[6], &flags) && (flags & kPfExiting) != 0) return true;
  // A SIGKILL sent but not yet acted on: pending for the process (ShdPnd) or a thread (SigPnd).
  std::ifstream status_in(absl::StrCat("/proc/", pid, "/status"));
  constexpr uint64_t kSigKillBit = uint64_t{1} << (SIGKILL - 1);
  for (std::string line; std::getline(status_in, line);) {
    absl::string_view rest(line);
    if (!absl::ConsumePrefix(&rest, "ShdPnd:") && !absl::ConsumePrefix(&rest, "SigPnd:")) continue;
    uint64_t mask = 0;
    if (absl::SimpleHexAtoi(absl::StripAsciiWhitespace(rest), &mask) && (mask & kSigKillBit) != 0) {
      return true;
    }
  }
  return false;
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

// The handshake. UCX 1.13 aborts the whole process (ucp_request.c: "Assertion ... got REP
// message", or REQUEST; fixed upstream in UCX 1.14) when a tcp endpoint's connection fails while
// a wireup message is still queued on it. Every connection makes endpoints on both sides: the
// initiator's, the one UCX makes on the owner for it, and the owner's reply connection (ReplyPeer)
// with UCX's for it on the initiator. A peer killed while any of them is still wiring up (a store
// node killed right after its first put into a worker, say) took the survivor with it. So
// Connect returns only once they are complete: it sends kHello with UCP_AM_SEND_FLAG_REPLY, which
// UCX sends only once the initiator's endpoint is wired (it carries the owner's endpoint id, which
// the owner's wireup reply brings), so the owner's side of it has sent its reply; the owner
// answers with kHelloAck over its reply connection (made or found by then), after that
// connection's own wireup request. Not with the flag: UCX pairs the owner's reply connection with
// the initiator's endpoint, and a message with the flag to an endpoint the initiator has closed
// is dropped. A peer that dies after the handshake fails as any connection does; what is left is
// a peer dying within the handshake itself.
absl::StatusOr<PeerId> UcxTransport::Connect(absl::string_view address) {
  absl::StatusOr<PeerId> id = OpenPeer(address, /*hello=*/true);
  if (!id.ok()) return id.status();
  // From a callback on the progress thread (a transfer's completion), which the answer needs:
  // not waited for there.
  if (std::this_thread::get_id() == thread_id_.load()) return id;
  return AwaitHandshake(*id);
}

absl::StatusOr<PeerId> UcxTransport::AwaitHandshake(PeerId id) {
  bool answered = false;
  const absl::Time give_up = absl::Now() + kHandshakeTimeout;
  while (true) {
    {
      absl::MutexLock lock(&peers_mu_);
      auto settled = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(peers_mu_) {
        auto it = peer_info_.find(id);
        return it == peer_info_.end() || it->second.failed || it->second.ready;
      };
      answered = peers_mu_.AwaitWithDeadline(absl::Condition(&settled),
                                             std::min(give_up, absl::Now() + kHelloResend));
      auto it = peer_info_.find(id);
      if (it != peer_info_.end() && it->second.ready && !it->second.failed) return id;
    }
    if (answered || absl::Now() >= give_up) break;
    // The owner's answer can be lost: its reply connection may be the other end of one this
    // transport has just closed (UCX pairs them), which it has not noticed yet. Said again.
    RunSync([&] {
      Peer* peer = FindPeer(id);
      if (peer != nullptr && !peer->failed) {
        SendOneWay(peer, AmHeader{static_cast<uint32_t>(AmType::kHello), 0, id, 0, 0}, address_,
                   /*reply=*/true);
      }
    });
  }
  if (answered) {
    return absl::UnavailableError(absl::StrCat("peer ", id, " failed during the handshake"));
  }
  const absl::Status status = absl::UnavailableError(absl::StrCat(
      "peer ", id, " did not answer the handshake in ", absl::FormatDuration(kHandshakeTimeout)));
  // Closed gracefully: an endpoint still wiring up must not be forced closed (see FailPeer).
  RunSync([&] {
    Peer* peer = FindPeer(id);
    if (peer != nullptr) FailPeer(peer, status, /*force=*/false);
  });
  return status;
}

absl::StatusOr<PeerId> UcxTransport::OpenPeer(absl::string_view address, bool hello) {
  if (!absl::StartsWith(address, kAddressMagic) ||
      address.size() <= kAddressMagic.size() + kIdentityBytes + kDataEndpointBytes) {
    return absl::InvalidArgumentError("not a UCX KV transport address");
  }
  {
    absl::MutexLock lock(&peers_mu_);
    for (const auto& [id, info] : peer_info_) {
      if (info.address == address && !info.failed) return id;
    }
  }
  const ProcessIdentity identity = DecodeIdentity(address.substr(kAddressMagic.size()));
  const DataEndpoint data_endpoint =
      DecodeDataEndpoint(address.substr(kAddressMagic.size() + kIdentityBytes));
  const std::string worker_address(
      address.substr(kAddressMagic.size() + kIdentityBytes + kDataEndpointBytes));
  const bool same_host = identity.boot_id == self_.boot_id;
  // A peer on this host (same boot, same pid namespace) is watched through a pidfd.
  int pidfd = -1;
  if (identity.boot_id == self_.boot_id && identity.pid_namespace == self_.pid_namespace &&
      identity.pid != 0) {
    pidfd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(identity.pid), 0));
    if (pidfd >= 0 && (ProcessStartTime(identity.pid) != identity.start_time ||
                       ProcessGoneOrDying(identity.pid, pidfd))) {
      // Not connected to: see ProcessGoneOrDying for what a refused connection would do.
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
    peer->data_endpoint = data_endpoint;
    peer->same_host = same_host;
    {
      absl::MutexLock lock(&peers_mu_);
      id = next_peer_id_++;
      peer_info_[id] = PeerInfo{std::string(address), peer->label, false, /*ready=*/!hello};
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
    Peer* opened = peer.get();
    peers_[id] = std::move(peer);
    if (hello) {
      SendOneWay(opened, AmHeader{static_cast<uint32_t>(AmType::kHello), 0, id, 0, 0}, address_,
                 /*reply=*/true);
    }
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

Peer* UcxTransport::FindPeer(PeerId id) {
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second.get();
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

absl::StatusOr<Peer*> UcxTransport::ReplyPeer(const std::string& address) {
  absl::Status last;
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<PeerId> id = OpenPeer(address, /*hello=*/false);
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
    // Frames queued or being written fail at once: their transfers' operations come back.
    if (peer->data != nullptr) peer->data->Abort(status);
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

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry
