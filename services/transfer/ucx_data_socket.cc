#include "services/transfer/ucx_data_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"

namespace ferry {
namespace transfer {
namespace ucx_internal {
namespace {

constexpr int kConnectTimeoutMs = 2000;

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Reads up to `length` bytes into `into`; returns how many arrived (fewer: end of stream or an
// error, in `status`).
uint64_t ReadFully(int fd, char* into, uint64_t length, absl::Status* status) {
  uint64_t got = 0;
  while (got < length) {
    const ssize_t n = recv(fd, into + got, length - got, MSG_WAITALL);
    if (n > 0) {
      got += static_cast<uint64_t>(n);
    } else if (n == 0) {
      *status = absl::UnavailableError("the data connection closed");
      break;
    } else if (errno != EINTR) {
      *status = Errno("reading the data connection");
      break;
    }
  }
  return got;
}

// Reads and drops `length` bytes; false if they did not all arrive.
bool Drain(int fd, uint64_t length) {
  char scratch[64 << 10];
  absl::Status status;
  while (length > 0) {
    const uint64_t chunk = std::min<uint64_t>(length, sizeof(scratch));
    if (ReadFully(fd, scratch, chunk, &status) < chunk) return false;
    length -= chunk;
  }
  return true;
}

}  // namespace

// --- DataListener -------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<DataListener>> DataListener::Start(Sink sink) {
  std::unique_ptr<DataListener> listener(new DataListener(std::move(sink)));
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  listener->listen_fd_ = fd;
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return Errno("bind");
  if (listen(fd, 64) != 0) return Errno("listen");
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return Errno("getsockname");
  }
  listener->endpoint_.port = ntohs(address.sin_port);
  // The host's IPv4 addresses, loopback last.
  std::vector<uint32_t> loopback;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) == 0) {
    for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET ||
          (i->ifa_flags & IFF_UP) == 0) {
        continue;
      }
      const uint32_t ip = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
      ((i->ifa_flags & IFF_LOOPBACK) != 0 ? loopback : listener->endpoint_.ipv4).push_back(ip);
    }
    freeifaddrs(interfaces);
  }
  for (uint32_t ip : loopback) listener->endpoint_.ipv4.push_back(ip);
  if (listener->endpoint_.ipv4.size() > kMaxDataAddresses) {
    listener->endpoint_.ipv4.erase(listener->endpoint_.ipv4.begin() + kMaxDataAddresses - 1,
                                   listener->endpoint_.ipv4.end() - 1);
  }
  DataListener* raw = listener.get();
  listener->accept_thread_ = std::thread([raw] { raw->AcceptLoop(); });
  return listener;
}

DataListener::~DataListener() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  {
    absl::MutexLock lock(&mu_);
    for (Connection& c : connections_) {
      if (c.fd >= 0) shutdown(c.fd, SHUT_RDWR);
    }
  }
  // The connections' threads end once their reads fail; none is added any more.
  for (Connection& c : connections_) {
    if (c.thread.joinable()) c.thread.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
}

void DataListener::AcceptLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    ReapFinished();
    pollfd p = {listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    absl::MutexLock lock(&mu_);
    if (stopping_ || connections_.size() >= kMaxConnections) {
      LOG(WARNING) << "KV transport: refused a data connection (" << connections_.size()
                   << " open)";
      close(fd);
      continue;
    }
    LOG(INFO) << "KV transport: bulk-data connection accepted (" << connections_.size() + 1
              << " open)";
    connections_.emplace_back();
    Connection* c = &connections_.back();
    c->fd = fd;
    c->thread = std::thread([this, c] { Serve(c); });
  }
}

void DataListener::ReapFinished() {
  std::list<Connection> finished;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->done) finished.splice(finished.end(), connections_, it);
      it = next;
    }
  }
  for (Connection& c : finished) c.thread.join();
}

void DataListener::Serve(Connection* c) {
  const int fd = c->fd;
  while (true) {
    DataFrameHeader h;
    absl::Status status;
    if (ReadFully(fd, reinterpret_cast<char*>(&h), sizeof(h), &status) < sizeof(h)) break;
    const auto type = static_cast<AmType>(h.am.type);
    if (h.magic != kDataFrameMagic || (type != AmType::kPutData && type != AmType::kPutCommit)) {
      LOG(WARNING) << "KV transport: closed a data connection that sent a malformed frame";
      sink_.refused(h, absl::InvalidArgumentError("malformed data frame"));
      break;
    }
    if (type == AmType::kPutCommit) {
      if (h.length > kMaxCommitFrameBytes) {
        sink_.refused(h, absl::InvalidArgumentError("oversized commit frame"));
        break;
      }
      std::string payload(h.length, '\0');
      if (ReadFully(fd, payload.data(), h.length, &status) < h.length) break;
      sink_.commit(h, std::move(payload));
      continue;
    }
    if (h.length > kDataFrameBytes) {
      sink_.refused(h, absl::InvalidArgumentError("oversized data frame"));
      break;
    }
    absl::StatusOr<uint64_t> hold = sink_.begin(h);
    if (!hold.ok()) {
      // Read and dropped: the commit that follows is answered with the refusal, as over active
      // messages.
      LOG(WARNING) << "KV transport: refused " << h.length << " bytes at "
                   << absl::StrCat("0x", absl::Hex(h.am.a)) << ": " << hold.status();
      sink_.refused(h, hold.status());
      if (!Drain(fd, h.length)) break;
      continue;
    }
    const uint64_t received = ReadFully(fd, reinterpret_cast<char*>(h.am.a), h.length, &status);
    sink_.end(h, *hold, received, status);
    if (!status.ok()) break;
  }
  absl::MutexLock lock(&mu_);
  close(c->fd);
  c->fd = -1;
  c->done = true;
}

// --- DataSender ---------------------------------------------------------------------------------

DataSender::DataSender(DataEndpoint endpoint, bool loopback)
    : endpoint_(std::move(endpoint)), loopback_(loopback) {
  thread_ = std::thread([this] { Loop(); });
}

DataSender::~DataSender() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (broken_.ok()) broken_ = absl::CancelledError("the data connection is closing");
    if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  }
  thread_.join();
}

void DataSender::Send(const DataFrameHeader& header, const void* data, std::string payload,
                      Done done) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(Frame{header, data, std::move(payload), std::move(done)});
}

void DataSender::Abort(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (broken_.ok()) broken_ = std::move(status);
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

void DataSender::Loop() {
  bool connected = false;
  while (true) {
    Frame frame;
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DataSender* s)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->queue_.empty() || s->stopping_; },
          this));
      if (queue_.empty()) break;  // stopping, nothing left
      frame = std::move(queue_.front());
      queue_.pop_front();
      status = broken_;
    }
    if (status.ok() && !connected) {
      status = ConnectNow();
      connected = status.ok();
    }
    if (status.ok()) status = Write(frame);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      if (broken_.ok()) broken_ = status;
      if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
    }
    frame.done(status);
  }
  absl::MutexLock lock(&mu_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status DataSender::ConnectNow() {
  std::vector<uint32_t> candidates;
  const uint32_t loopback_ip = htonl(INADDR_LOOPBACK);
  if (loopback_) candidates.push_back(loopback_ip);
  for (uint32_t ip : endpoint_.ipv4) {
    // Another host's loopback address is this host's.
    const bool is_loopback = (ntohl(ip) >> 24) == 127;
    if (!is_loopback) candidates.push_back(ip);
  }
  absl::Status last = absl::UnavailableError("the peer advertises no data address");
  for (uint32_t ip : candidates) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return Errno("socket");
    {
      absl::MutexLock lock(&mu_);
      if (!broken_.ok()) {
        close(fd);
        return broken_;
      }
      fd_ = fd;  // Abort shuts it down, which ends the wait below
    }
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = ip;
    address.sin_port = htons(endpoint_.port);
    int rc = connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      rc = poll(&p, 1, kConnectTimeoutMs) == 1 ? 0 : -1;
      int error = 0;
      socklen_t length = sizeof(error);
      if (rc == 0 && (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0 || error != 0)) {
        errno = error;
        rc = -1;
      } else if (rc != 0) {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      const int flags = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return absl::OkStatus();
    }
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &address.sin_addr, text, sizeof(text));
    last = absl::UnavailableError(absl::StrCat("cannot connect to the peer's data port at ", text,
                                               ":", endpoint_.port, ": ", std::strerror(errno)));
    absl::MutexLock lock(&mu_);
    close(fd);
    fd_ = -1;
  }
  return last;
}

absl::Status DataSender::Write(const Frame& frame) {
  int fd;
  {
    absl::MutexLock lock(&mu_);
    fd = fd_;
  }
  iovec parts[2];
  parts[0] = {const_cast<DataFrameHeader*>(&frame.header), sizeof(DataFrameHeader)};
  parts[1] = frame.data != nullptr
                 ? iovec{const_cast<void*>(frame.data), frame.header.length}
                 : iovec{const_cast<char*>(frame.payload.data()), frame.payload.size()};
  iovec* next = parts;
  int left = 2;
  while (left > 0) {
    msghdr message = {};
    message.msg_iov = next;
    message.msg_iovlen = left;
    const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("writing the data connection");
    }
    size_t sent = static_cast<size_t>(n);
    while (left > 0 && sent >= next->iov_len) {
      sent -= next->iov_len;
      ++next;
      --left;
    }
    if (left > 0) {
      next->iov_base = static_cast<char*>(next->iov_base) + sent;
      next->iov_len -= sent;
    }
  }
  return absl::OkStatus();
}

}  // namespace ucx_internal
}  // namespace transfer
}  // namespace ferry
