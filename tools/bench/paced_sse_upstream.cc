#include "tools/bench/paced_sse_upstream.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <unordered_map>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ferry {

namespace {

constexpr size_t kMaxRequestBytes = 64 * 1024;
constexpr size_t kMaxPendingBytes = 1 << 20;
constexpr uint64_t kStopKey = UINT64_MAX;
constexpr uint64_t kListenKey = UINT64_MAX - 1;

std::string Chunk(absl::string_view data) {
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

// The integer after `"key":` in a JSON body (a small scan: the bench's own requests), or -1.
int64_t IntField(absl::string_view body, absl::string_view key) {
  const size_t at = body.find(absl::StrCat("\"", key, "\""));
  if (at == absl::string_view::npos) return -1;
  size_t i = body.find(':', at);
  if (i == absl::string_view::npos) return -1;
  ++i;
  while (i < body.size() && body[i] == ' ') ++i;
  size_t end = i;
  while (end < body.size() && end - i < 10 && absl::ascii_isdigit(body[end])) ++end;
  int64_t v = -1;
  if (end == i || !absl::SimpleAtoi(body.substr(i, end - i), &v)) return -1;
  return v;
}

}  // namespace

struct PacedSseUpstream::Connection {
  int fd = -1;
  std::string in;
  std::string out;
  bool want_write = false;
  bool streaming = false;
  int64_t tokens_left = 0;
  int64_t id = 0;
};

PacedSseUpstream::PacedSseUpstream(std::chrono::microseconds token_interval, int max_connections,
                                   size_t event_bytes)
    : token_interval_(token_interval),
      max_connections_(max_connections),
      event_bytes_(std::min<size_t>(event_bytes, 4096)) {}

absl::StatusOr<std::unique_ptr<PacedSseUpstream>> PacedSseUpstream::Start(
    std::chrono::microseconds token_interval, int max_connections, size_t event_bytes) {
  if (token_interval.count() <= 0 || max_connections < 1) {
    return absl::InvalidArgumentError("PacedSseUpstream: a positive interval and connections");
  }
  std::unique_ptr<PacedSseUpstream> u(
      new PacedSseUpstream(token_interval, max_connections, event_bytes));
  u->listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  u->epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  u->stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (u->listen_fd_ < 0 || u->epoll_fd_ < 0 || u->stop_fd_ < 0) {
    return absl::InternalError(absl::StrCat("upstream: ", std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(u->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(u->listen_fd_, 4096) != 0 ||
      getsockname(u->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return absl::InternalError(absl::StrCat("upstream listen: ", std::strerror(errno)));
  }
  u->port_ = ntohs(addr.sin_port);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenKey;
  epoll_ctl(u->epoll_fd_, EPOLL_CTL_ADD, u->listen_fd_, &ev);
  ev.data.u64 = kStopKey;
  epoll_ctl(u->epoll_fd_, EPOLL_CTL_ADD, u->stop_fd_, &ev);
  u->thread_ = std::thread([p = u.get()] { p->Loop(); });
  return u;
}

PacedSseUpstream::~PacedSseUpstream() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

void PacedSseUpstream::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  if (write(stop_fd_, &one, sizeof(one)) < 0) {
    // An eventfd write fails only on counter overflow, which one write cannot cause.
  }
  thread_.join();
}

void PacedSseUpstream::Loop() {
  using Clock = std::chrono::steady_clock;
  std::unordered_map<int, std::unique_ptr<Connection>> connections;
  int64_t next_id = 0;
  auto drop = [&](int fd) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    connections.erase(fd);
  };
  // Sends what `c` holds; false when it was dropped.
  auto flush = [&](Connection& c) {
    while (!c.out.empty()) {
      const ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          drop(c.fd);
          return false;
        }
        break;
      }
      c.out.erase(0, static_cast<size_t>(n));
    }
    if (c.out.size() > kMaxPendingBytes) {
      drop(c.fd);
      return false;
    }
    const bool want = !c.out.empty();
    if (want != c.want_write) {
      epoll_event ev{};
      ev.events = EPOLLIN | (want ? EPOLLOUT : 0);
      ev.data.u64 = static_cast<uint64_t>(c.fd);
      epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
      c.want_write = want;
    }
    return true;
  };
  auto event = [&](int64_t id, absl::string_view delta, absl::string_view finish) {
    auto make = [&](absl::string_view id_text) {
      return absl::StrCat("data: {\"id\":\"chatcmpl-", id_text,
                          "\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,"
                          "\"model\":\"smol\",\"choices\":[{\"index\":0,\"delta\":",
                          delta, ",\"finish_reason\":", finish, "}]}\n\n");
    };
    const std::string plain = absl::StrCat(id);
    std::string e = make(plain);
    // The id padded with leading zeros so that the event is event_bytes_ long.
    if (e.size() < event_bytes_) e = make(std::string(event_bytes_ - e.size(), '0') + plain);
    return e;
  };

  // Parses and answers the requests `c` holds; false when it was dropped.
  auto serve = [&](Connection& c) {
    while (!c.streaming) {
      const size_t head_end = c.in.find("\r\n\r\n");
      if (head_end == std::string::npos) {
        if (c.in.size() > kMaxRequestBytes) {
          c.out +=
              "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
          flush(c);
          drop(c.fd);
          return false;
        }
        return true;
      }
      const std::string head = absl::AsciiStrToLower(absl::string_view(c.in).substr(0, head_end));
      int64_t length = 0;
      if (const size_t at = head.find("\r\ncontent-length:"); at != std::string::npos) {
        length = IntField(absl::StrCat("\"x\":", head.substr(at + 17, 12)), "x");
      }
      if (length < 0 || static_cast<size_t>(length) > kMaxRequestBytes) {
        c.out += "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        flush(c);
        drop(c.fd);
        return false;
      }
      if (c.in.size() < head_end + 4 + static_cast<size_t>(length)) return true;
      const std::string body = c.in.substr(head_end + 4, static_cast<size_t>(length));
      c.in.erase(0, head_end + 4 + static_cast<size_t>(length));
      if (!absl::StartsWith(head, "post ")) {
        const std::string json =
            R"({"status":"ok","model_path":"smol","model":"smol","is_generation":true,)"
            R"("object":"list","data":[{"id":"smol","object":"model","owned_by":"bench"}]})";
        absl::StrAppend(&c.out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
                        "Content-Length: ", json.size(), "\r\n\r\n", json);
        continue;
      }
      c.id = next_id++;
      int64_t max_tokens = IntField(body, "max_tokens");
      if (max_tokens < 0) max_tokens = IntField(body, "max_completion_tokens");
      if (max_tokens < 0) max_tokens = 16;
      const bool stream = body.find("\"stream\":true") != std::string::npos ||
                          body.find("\"stream\": true") != std::string::npos;
      if (!stream) {
        const std::string json = absl::StrCat(
            R"({"id":"chatcmpl-)", c.id,
            R"(","object":"chat.completion","created":1700000000,"model":"smol","choices":)"
            R"([{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":)"
            R"("length"}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}})");
        absl::StrAppend(&c.out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n",
                        "Content-Length: ", json.size(), "\r\n\r\n", json);
        continue;
      }
      absl::StrAppend(&c.out,
                      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                      "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n",
                      Chunk(event(c.id, R"({"role":"assistant","content":""})", "null")));
      c.streaming = true;
      c.tokens_left = max_tokens;
    }
    return true;
  };

  std::vector<epoll_event> ready(1024);
  Clock::time_point next_tick = Clock::now() + token_interval_;
  while (true) {
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
        next_tick - Clock::now() + std::chrono::microseconds(999));
    const int n = epoll_wait(epoll_fd_, ready.data(), static_cast<int>(ready.size()),
                             static_cast<int>(std::max<int64_t>(0, wait.count())));
    if (n < 0 && errno != EINTR) return;
    for (int k = 0; k < n; ++k) {
      const uint64_t key = ready[k].data.u64;
      if (key == kStopKey) {
        for (auto& [fd, c] : connections) close(fd);
        return;
      }
      if (key == kListenKey) {
        while (true) {
          const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          if (static_cast<int>(connections.size()) >= max_connections_) {
            close(fd);
            continue;
          }
          const int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          auto c = std::make_unique<Connection>();
          c->fd = fd;
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.u64 = static_cast<uint64_t>(fd);
          epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
          connections.emplace(fd, std::move(c));
        }
        continue;
      }
      auto it = connections.find(static_cast<int>(key));
      if (it == connections.end()) continue;
      Connection& c = *it->second;
      if ((ready[k].events & EPOLLOUT) != 0 && !flush(c)) continue;
      if ((ready[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) == 0) continue;
      char buf[16384];
      bool alive = true;
      while (alive) {
        const ssize_t got = recv(c.fd, buf, sizeof(buf), 0);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          drop(c.fd);
          alive = false;
          break;
        }
        if (got < 0) break;
        if (c.in.size() + static_cast<size_t>(got) > 2 * kMaxRequestBytes) {
          drop(c.fd);
          alive = false;
          break;
        }
        c.in.append(buf, static_cast<size_t>(got));
      }
      if (alive && serve(c)) flush(c);
    }
    if (Clock::now() < next_tick) continue;
    next_tick += token_interval_;
    if (next_tick < Clock::now()) next_tick = Clock::now() + token_interval_;  // fell behind
    std::vector<int> fds;
    fds.reserve(connections.size());
    for (auto& [fd, c] : connections) {
      if (c->streaming) fds.push_back(fd);
    }
    for (int fd : fds) {
      auto it = connections.find(fd);
      if (it == connections.end()) continue;
      Connection& c = *it->second;
      c.out += Chunk(event(c.id, R"({"content":" token"})", "null"));
      tokens_sent_.fetch_add(1, std::memory_order_relaxed);
      if (--c.tokens_left <= 0) {
        absl::StrAppend(&c.out, Chunk(event(c.id, "{}", "\"length\"")), Chunk("data: [DONE]\n\n"),
                        "0\r\n\r\n");
        c.streaming = false;
      }
      if (flush(c) && !c.streaming && serve(c)) flush(c);
    }
  }
}

}  // namespace ferry
