// EpollSseClient: the load generator of `ferry bench frontdoor`'s scale run. One thread, one
// epoll loop, N non-blocking kept-alive HTTP/1.1 connections to 127.0.0.1:port, each POSTing one
// streaming request (a body the caller gives) and reading its Server-Sent Events answer: the
// response head, then the body (chunked or not), split into events at blank lines. An event is a
// token when it is a `data:` event other than `data: [DONE]` whose payload carries a non-empty
// `"content":"..."` (the OpenAI chat chunk's delta; the role chunk and the usage chunk do not
// count). The arrival time of each token is kept per stream (at most `max_arrivals_per_stream`,
// the rest counted only), for inter-token gaps; the totals are atomics that other threads may
// read while the loop runs, so that a caller can open a measurement window on a running load.
// aiperf and thread-per-stream clients cannot drive thousands of streams from a small machine:
// this loop costs one epoll_wait per wakeup and one read per ready connection.
//
// Bounds: each connection's unparsed input is at most `max_buffer_bytes` (a head or an event
// larger than that fails the stream, it never grows); arrivals per stream as above.
// Errors: a connection that fails (refused, reset, a non-200 answer, a malformed chunk) ends its
// stream as failed with a reason; the loop goes on with the others. Nothing here crashes on what
// the server sends.
//
// Threading: Run() on one thread (it owns every connection); Stop(), tokens(), streams_started(),
// streams_ended() are thread-safe; stream() only after Run() returned.

#ifndef FERRY_TOOLS_BENCH_EPOLL_SSE_CLIENT_H_
#define FERRY_TOOLS_BENCH_EPOLL_SSE_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

struct EpollSseClientOptions {
  int port = 0;     // 127.0.0.1:port
  int streams = 0;  // connections, one request each
  std::string target = "/v1/chat/completions";
  std::function<std::string(int)> body;  // the JSON body of stream i
  size_t max_buffer_bytes = 64 * 1024;   // unparsed input per connection
  size_t max_arrivals_per_stream = 4096;
};

class EpollSseClient {
 public:
  using Clock = std::chrono::steady_clock;

  struct Stream {
    bool ok = false;      // ended with data: [DONE] after a 200
    bool failed = false;  // with `error`
    std::string error;
    int64_t tokens = 0;  // token events, all of them
    // The first token event's bytes as the server wrote it ("data: ", payload, blank line).
    int64_t event_bytes = 0;
    std::vector<Clock::time_point> arrivals;  // the first max_arrivals_per_stream tokens
  };

  // Creates the epoll set; connections are opened by Run().
  static absl::StatusOr<std::unique_ptr<EpollSseClient>> Create(EpollSseClientOptions options);
  ~EpollSseClient();
  EpollSseClient(const EpollSseClient&) = delete;
  EpollSseClient& operator=(const EpollSseClient&) = delete;

  // Connects, sends, reads until every stream ended or Stop() was called. Error only when the
  // loop itself cannot run (epoll, sockets); a stream's failure is in its Stream. Once.
  absl::Status Run();
  void Stop();

  int64_t tokens() const { return tokens_.load(std::memory_order_relaxed); }
  int streams_started() const { return started_.load(std::memory_order_relaxed); }  // >= 1 token
  int streams_ended() const { return ended_.load(std::memory_order_relaxed); }

  const Stream& stream(int i) const { return streams_[static_cast<size_t>(i)]; }

 private:
  struct Connection;
  explicit EpollSseClient(EpollSseClientOptions options);
  void Fail(Connection& c, const std::string& why);
  void End(Connection& c, bool ok);
  void OnWritable(Connection& c);
  void OnReadable(Connection& c);
  // Parses what `c` holds; false when it failed or ended.
  bool Parse(Connection& c);
  bool ParseEvents(Connection& c, absl::string_view body);
  void OnEvent(Connection& c, absl::string_view event);

  EpollSseClientOptions options_;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;  // eventfd
  std::vector<Connection> connections_;
  std::vector<Stream> streams_;
  std::atomic<int64_t> tokens_{0};
  std::atomic<int> started_{0};
  std::atomic<int> ended_{0};
};

}  // namespace ferry

#endif  // FERRY_TOOLS_BENCH_EPOLL_SSE_CLIENT_H_
