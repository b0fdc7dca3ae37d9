#include "tools/bench/epoll_sse_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ferry {

namespace {

constexpr size_t kMaxChunkLine = 64;  // "<hex size>[;ext]\r\n"

}  // namespace

struct EpollSseClient::Connection {
  enum class State { kConnecting, kSending, kHead, kBody, kDone };
  int index = 0;
  int fd = -1;
  State state = State::kConnecting;
  std::string out;  // the request
  size_t sent = 0;
  std::string in;  // raw bytes not parsed yet
  bool chunked = false;
  uint64_t chunk_left = 0;  // data bytes of the current chunk still to come
  size_t crlf_left = 0;     // the CRLF after a chunk's data
  std::string events;       // the body, decoded, not yet split into events
  Clock::time_point now;    // when the bytes being parsed arrived
};

EpollSseClient::EpollSseClient(EpollSseClientOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<EpollSseClient>> EpollSseClient::Create(
    EpollSseClientOptions options) {
  if (options.streams < 1 || options.port <= 0 || options.port > 65535 || !options.body) {
    return absl::InvalidArgumentError("EpollSseClient: streams >= 1, a port and a body");
  }
  if (options.max_buffer_bytes < 1024) {
    return absl::InvalidArgumentError("EpollSseClient: max_buffer_bytes must be >= 1KiB");
  }
  std::unique_ptr<EpollSseClient> c(new EpollSseClient(std::move(options)));
  c->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  c->stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->epoll_fd_ < 0 || c->stop_fd_ < 0) {
    return absl::InternalError(absl::StrCat("epoll/eventfd: ", std::strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = UINT64_MAX;
  if (epoll_ctl(c->epoll_fd_, EPOLL_CTL_ADD, c->stop_fd_, &ev) != 0) {
    return absl::InternalError(absl::StrCat("epoll_ctl: ", std::strerror(errno)));
  }
  c->connections_.resize(static_cast<size_t>(c->options_.streams));
  c->streams_.resize(static_cast<size_t>(c->options_.streams));
  return c;
}

EpollSseClient::~EpollSseClient() {
  for (Connection& c : connections_) {
    if (c.fd >= 0) close(c.fd);
  }
  if (stop_fd_ >= 0) close(stop_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void EpollSseClient::Stop() {
  const uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof(one)) < 0) {
    // The eventfd's counter cannot overflow from a few Stop() calls; nothing else can fail here.
  }
}

void EpollSseClient::End(Connection& c, bool ok) {
  if (c.state == Connection::State::kDone) return;
  c.state = Connection::State::kDone;
  streams_[static_cast<size_t>(c.index)].ok = ok;
  if (c.fd >= 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
    c.fd = -1;
  }
  std::string().swap(c.in);
  std::string().swap(c.events);
  std::string().swap(c.out);
  ended_.fetch_add(1, std::memory_order_relaxed);
}

void EpollSseClient::Fail(Connection& c, const std::string& why) {
  if (c.state == Connection::State::kDone) return;
  Stream& s = streams_[static_cast<size_t>(c.index)];
  s.failed = true;
  s.error = why;
  End(c, false);
}

absl::Status EpollSseClient::Run() {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options_.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int i = 0; i < options_.streams; ++i) {
    Connection& c = connections_[static_cast<size_t>(i)];
    c.index = i;
    const std::string body = options_.body(i);
    c.out = absl::StrCat("POST ", options_.target,
                         " HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
                         "Content-Type: application/json\r\nContent-Length: ",
                         body.size(), "\r\n\r\n", body);
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
    const int one = 1;
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
        errno != EINPROGRESS) {
      Fail(c, absl::StrCat("connect: ", std::strerror(errno)));
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u64 = static_cast<uint64_t>(i);
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c.fd, &ev) != 0) {
      return absl::InternalError(absl::StrCat("epoll_ctl: ", std::strerror(errno)));
    }
  }
  std::vector<epoll_event> ready(1024);
  while (ended_.load(std::memory_order_relaxed) < options_.streams) {
    const int n = epoll_wait(epoll_fd_, ready.data(), static_cast<int>(ready.size()), 1000);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("epoll_wait: ", std::strerror(errno)));
    }
    const Clock::time_point now = Clock::now();
    for (int k = 0; k < n; ++k) {
      if (ready[k].data.u64 == UINT64_MAX) return absl::OkStatus();  // Stop()
      Connection& c = connections_[ready[k].data.u64];
      if (c.state == Connection::State::kDone) continue;
      c.now = now;
      if ((ready[k].events & EPOLLOUT) != 0) OnWritable(c);
      if (c.state != Connection::State::kDone &&
          (ready[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
        OnReadable(c);
      }
    }
  }
  return absl::OkStatus();
}

void EpollSseClient::OnWritable(Connection& c) {
  if (c.state == Connection::State::kConnecting) {
    int error = 0;
    socklen_t len = sizeof(error);
    if (getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
      Fail(c, absl::StrCat("connect: ", std::strerror(error != 0 ? error : errno)));
      return;
    }
    c.state = Connection::State::kSending;
  }
  if (c.state != Connection::State::kSending) return;
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Fail(c, absl::StrCat("send: ", std::strerror(errno)));
      return;
    }
    c.sent += static_cast<size_t>(n);
  }
  std::string().swap(c.out);
  c.state = Connection::State::kHead;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = static_cast<uint64_t>(c.index);
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
}

void EpollSseClient::OnReadable(Connection& c) {
  char buf[16384];
  while (c.state != Connection::State::kDone) {
    const ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Fail(c, absl::StrCat("recv: ", std::strerror(errno)));
      return;
    }
    if (n == 0) {
      Fail(c, "the server closed the connection before data: [DONE]");
      return;
    }
    if (c.in.size() + static_cast<size_t>(n) > options_.max_buffer_bytes + sizeof(buf)) {
      Fail(c, "more unparsed input than max_buffer_bytes");
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    if (!Parse(c)) return;
    if (static_cast<size_t>(n) < sizeof(buf)) return;  // drained (level-triggered: no starvation)
  }
}

bool EpollSseClient::Parse(Connection& c) {
  size_t at = 0;
  if (c.state == Connection::State::kHead) {
    const size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) {
      if (c.in.size() > options_.max_buffer_bytes) {
        Fail(c, "a response head larger than max_buffer_bytes");
        return false;
      }
      return true;
    }
    const absl::string_view head(c.in.data(), end);
    if (!absl::StartsWith(head, "HTTP/1.1 200") && !absl::StartsWith(head, "HTTP/1.0 200")) {
      Fail(c, std::string(head.substr(0, head.find('\r'))));
      return false;
    }
    const std::string lower = absl::AsciiStrToLower(head);
    c.chunked = lower.find("\r\ntransfer-encoding: chunked") != std::string::npos ||
                lower.find("\r\ntransfer-encoding:chunked") != std::string::npos;
    c.state = Connection::State::kBody;
    at = end + 4;
  }
  if (!c.chunked) {
    if (!ParseEvents(c, absl::string_view(c.in).substr(at))) return false;
    c.in.clear();
    return true;
  }
  while (at < c.in.size()) {
    if (c.crlf_left > 0) {
      const size_t take = std::min(c.crlf_left, c.in.size() - at);
      at += take;
      c.crlf_left -= take;
      continue;
    }
    if (c.chunk_left == 0) {
      const size_t eol = c.in.find("\r\n", at);
      if (eol == std::string::npos) {
        if (c.in.size() - at > kMaxChunkLine) {
          Fail(c, "a chunk-size line too long");
          return false;
        }
        break;
      }
      absl::string_view line(c.in.data() + at, eol - at);
      line = line.substr(0, line.find(';'));
      uint64_t size = 0;
      if (line.empty() || line.size() > 16 || !absl::SimpleHexAtoi(line, &size)) {
        Fail(c, "a malformed chunk-size line");
        return false;
      }
      at = eol + 2;
      if (size == 0) {
        Fail(c, "the body ended before data: [DONE]");
        return false;
      }
      c.chunk_left = size;
      continue;
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(c.chunk_left, c.in.size() - at));
    if (!ParseEvents(c, absl::string_view(c.in.data() + at, take))) return false;
    at += take;
    c.chunk_left -= take;
    if (c.chunk_left == 0) c.crlf_left = 2;
  }
  c.in.erase(0, at);
  return true;
}

bool EpollSseClient::ParseEvents(Connection& c, absl::string_view body) {
  // Events end at a blank line; most reads hold whole events, so split in place when nothing is
  // pending and keep only the tail.
  absl::string_view data = body;
  if (!c.events.empty()) {
    c.events.append(body.data(), body.size());
    data = c.events;
  }
  size_t start = 0;
  while (true) {
    const size_t end = data.find("\n\n", start);
    if (end == absl::string_view::npos) break;
    OnEvent(c, data.substr(start, end - start));
    if (c.state == Connection::State::kDone) return false;
    start = end + 2;
  }
  const absl::string_view rest = data.substr(start);
  if (rest.size() > options_.max_buffer_bytes) {
    Fail(c, "an event larger than max_buffer_bytes");
    return false;
  }
  if (c.events.empty()) {
    c.events.assign(rest.data(), rest.size());
  } else {
    c.events.erase(0, start);
  }
  return true;
}

void EpollSseClient::OnEvent(Connection& c, absl::string_view event) {
  while (!event.empty() && (event.front() == '\n' || event.front() == '\r')) event.remove_prefix(1);
  if (!absl::StartsWith(event, "data:")) return;  // comments, event: lines
  absl::string_view payload = event.substr(5);
  if (!payload.empty() && payload.front() == ' ') payload.remove_prefix(1);
  if (absl::StartsWith(payload, "[DONE]")) {
    End(c, true);
    return;
  }
  const size_t content = payload.find("\"content\":\"");
  if (content == absl::string_view::npos || content + 11 >= payload.size() ||
      payload[content + 11] == '"') {
    return;  // the role chunk, the usage chunk
  }
  Stream& s = streams_[static_cast<size_t>(c.index)];
  if (s.tokens == 0) {
    s.event_bytes = static_cast<int64_t>(event.size()) + 2;
    started_.fetch_add(1, std::memory_order_relaxed);
  }
  ++s.tokens;
  if (s.arrivals.size() < options_.max_arrivals_per_stream) s.arrivals.push_back(c.now);
  tokens_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace ferry
