#include "services/common/dns_resolver.h"

#include <ares.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace ferry {
namespace {

// c-ares' process-wide initialisation, once (gRPC may have done its own: it is reference counted).
absl::Status InitLibrary() {
  static const int rc = ares_library_init(ARES_LIB_INIT_ALL);
  if (rc != ARES_SUCCESS) {
    return absl::InternalError(absl::StrCat("c-ares: ", ares_strerror(rc)));
  }
  return absl::OkStatus();
}

// A lookup's answer, from the c-ares callback (on the lookup's thread).
struct Answer {
  bool done = false;
  int status = ARES_SUCCESS;
  std::vector<std::string> addresses;
  std::string name;
};

absl::Status LookupError(int status, absl::string_view what) {
  switch (status) {
    case ARES_ENOTFOUND:
    case ARES_ENODATA:
      return absl::NotFoundError(absl::StrCat(what, ": no such record"));
    case ARES_EBADNAME:
    case ARES_EBADFAMILY:
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", ares_strerror(status)));
    default:
      // ETIMEOUT, ECONNREFUSED, ESERVFAIL, EREFUSED, ECANCELLED (our deadline), EFORMERR...
      return absl::UnavailableError(absl::StrCat(what, ": ", ares_strerror(status)));
  }
}

}  // namespace

struct DnsResolver::Channel {
  ares_channel channel = nullptr;
  ~Channel() {
    if (channel != nullptr) ares_destroy(channel);
  }
};

namespace {

// Runs `channel`'s queries until `answer` is done or `deadline` passes (then cancels them: their
// callbacks run with ARES_ECANCELLED before this returns).
void Drive(ares_channel channel, const Answer& answer, absl::Time deadline) {
  while (!answer.done) {
    ares_socket_t socks[ARES_GETSOCK_MAXNUM];
    const int bits = ares_getsock(channel, socks, ARES_GETSOCK_MAXNUM);
    pollfd fds[ARES_GETSOCK_MAXNUM];
    int n = 0;
    for (int i = 0; i < ARES_GETSOCK_MAXNUM; ++i) {
      const bool readable = ARES_GETSOCK_READABLE(bits, i);
      const bool writable = ARES_GETSOCK_WRITABLE(bits, i);
      if (!readable && !writable) continue;
      fds[n].fd = socks[i];
      fds[n].events = static_cast<short>((readable ? POLLIN : 0) | (writable ? POLLOUT : 0));
      fds[n].revents = 0;
      ++n;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      ares_cancel(channel);
      return;
    }
    timeval max_wait = absl::ToTimeval(left);
    timeval storage;
    const timeval* wait = ares_timeout(channel, &max_wait, &storage);
    const int wait_ms = static_cast<int>(wait->tv_sec * 1000 + (wait->tv_usec + 999) / 1000);
    const int ready = poll(fds, static_cast<nfds_t>(n), std::max(wait_ms, 1));
    if (ready <= 0) {
      ares_process_fd(channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);  // timeouts
      continue;
    }
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      const bool in = (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) != 0;
      const bool out = (fds[i].revents & POLLOUT) != 0;
      ares_process_fd(channel, in ? fds[i].fd : ARES_SOCKET_BAD, out ? fds[i].fd : ARES_SOCKET_BAD);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DnsResolver>> DnsResolver::Create(const DnsOptions& options) {
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("DNS: the lookup timeout must be > 0");
  }
  if (absl::Status s = InitLibrary(); !s.ok()) return s;
  ares_options ao;
  std::memset(&ao, 0, sizeof(ao));
  int mask = 0;
  // Each try waits at most a third of the lookup's time, so that a lost datagram is asked again
  // (and the next server tried) well within it.
  ao.timeout = static_cast<int>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(options.timeout) / 3, 50, 2000));
  mask |= ARES_OPT_TIMEOUTMS;
  ao.tries = 2;
  mask |= ARES_OPT_TRIES;
  char dns_only[] = "b";
  if (!options.servers.empty()) {
    ao.lookups = dns_only;  // the servers given, not /etc/hosts
    mask |= ARES_OPT_LOOKUPS;
  }
  auto channel = std::make_unique<Channel>();
  int rc = ares_init_options(&channel->channel, &ao, mask);
  if (rc != ARES_SUCCESS) {
    channel->channel = nullptr;
    return absl::InternalError(absl::StrCat("DNS: c-ares: ", ares_strerror(rc)));
  }
  if (!options.servers.empty()) {
    for (const std::string& server : options.servers) {
      // An address (no name: the resolver must not need a resolver), with an optional port.
      std::string host = server;
      int port = 53;
      if (!server.empty() &&
          (server.front() == '[' || std::count(server.begin(), server.end(), ':') == 1)) {
        if (absl::Status s = SplitHostPort(server, &host, &port); !s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat("DNS server '", server, "': ", s.message()));
        }
      }
      in6_addr v6;
      in_addr v4;
      if (inet_pton(AF_INET, host.c_str(), &v4) != 1 &&
          inet_pton(AF_INET6, host.c_str(), &v6) != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("DNS server '", server, "': not an IP address (ip or ip:port)"));
      }
    }
    const std::string csv = absl::StrJoin(options.servers, ",");
    rc = ares_set_servers_ports_csv(channel->channel, csv.c_str());
    if (rc != ARES_SUCCESS) {
      return absl::InvalidArgumentError(
          absl::StrCat("DNS servers '", csv, "': ", ares_strerror(rc)));
    }
  }
  return std::unique_ptr<DnsResolver>(new DnsResolver(options, std::move(channel)));
}

DnsResolver::DnsResolver(const DnsOptions& options, std::unique_ptr<Channel> channel)
    : options_(options), configured_(std::move(channel)) {}

DnsResolver::~DnsResolver() = default;

absl::StatusOr<std::vector<std::string>> DnsResolver::Addresses(absl::string_view name) const {
  const std::string what = absl::StrCat("DNS lookup of '", name, "'");
  if (name.empty() || name.size() > 253 || name.find_first_of(" \t\r\n/") != name.npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": not a host name"));
  }
  Channel channel;
  int rc = ares_dup(&channel.channel, configured_->channel);
  if (rc != ARES_SUCCESS) {
    channel.channel = nullptr;
    return absl::InternalError(absl::StrCat(what, ": c-ares: ", ares_strerror(rc)));
  }
  Answer answer;
  ares_addrinfo_hints hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_flags = ARES_AI_NOSORT;
  const std::string host(name);
  ares_getaddrinfo(
      channel.channel, host.c_str(), nullptr, &hints,
      [](void* arg, int status, int /*timeouts*/, ares_addrinfo* result) {
        auto* a = static_cast<Answer*>(arg);
        a->done = true;
        a->status = status;
        if (result == nullptr) return;
        for (ares_addrinfo_node* node = result->nodes; node != nullptr; node = node->ai_next) {
          char text[INET6_ADDRSTRLEN] = {0};
          const void* addr = nullptr;
          if (node->ai_family == AF_INET) {
            addr = &reinterpret_cast<sockaddr_in*>(node->ai_addr)->sin_addr;
          } else if (node->ai_family == AF_INET6) {
            addr = &reinterpret_cast<sockaddr_in6*>(node->ai_addr)->sin6_addr;
          }
          if (addr != nullptr && inet_ntop(node->ai_family, addr, text, sizeof(text)) != nullptr) {
            a->addresses.emplace_back(text);
          }
        }
        ares_freeaddrinfo(result);
      },
      &answer);
  Drive(channel.channel, answer, absl::Now() + options_.timeout);
  if (!answer.done) return absl::UnavailableError(absl::StrCat(what, ": timed out"));
  if (answer.status != ARES_SUCCESS) return LookupError(answer.status, what);
  std::sort(answer.addresses.begin(), answer.addresses.end());
  answer.addresses.erase(std::unique(answer.addresses.begin(), answer.addresses.end()),
                         answer.addresses.end());
  if (answer.addresses.empty()) return absl::NotFoundError(absl::StrCat(what, ": no address"));
  return answer.addresses;
}

absl::StatusOr<std::string> DnsResolver::NameOf(absl::string_view address) const {
  const std::string what = absl::StrCat("DNS reverse lookup of '", address, "'");
  const std::string text(address);
  in6_addr v6;
  in_addr v4;
  int family = AF_INET;
  const void* addr = &v4;
  int len = sizeof(v4);
  if (inet_pton(AF_INET, text.c_str(), &v4) != 1) {
    if (inet_pton(AF_INET6, text.c_str(), &v6) != 1) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": not an IP address"));
    }
    family = AF_INET6;
    addr = &v6;
    len = sizeof(v6);
  }
  Channel channel;
  int rc = ares_dup(&channel.channel, configured_->channel);
  if (rc != ARES_SUCCESS) {
    channel.channel = nullptr;
    return absl::InternalError(absl::StrCat(what, ": c-ares: ", ares_strerror(rc)));
  }
  Answer answer;
  ares_gethostbyaddr(
      channel.channel, addr, len, family,
      [](void* arg, int status, int /*timeouts*/, hostent* host) {
        auto* a = static_cast<Answer*>(arg);
        a->done = true;
        a->status = status;
        if (status == ARES_SUCCESS && host != nullptr && host->h_name != nullptr) {
          a->name = std::string(absl::StripSuffix(host->h_name, "."));
        }
      },
      &answer);
  Drive(channel.channel, answer, absl::Now() + options_.timeout);
  if (!answer.done) return absl::UnavailableError(absl::StrCat(what, ": timed out"));
  if (answer.status != ARES_SUCCESS) return LookupError(answer.status, what);
  if (answer.name.empty()) return absl::NotFoundError(absl::StrCat(what, ": no name"));
  return answer.name;
}

}  // namespace ferry
