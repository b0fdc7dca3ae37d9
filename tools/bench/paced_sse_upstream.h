// PacedSseUpstream: the bench-owned OpenAI-compatible upstream that `ferry bench frontdoor` puts
// behind a peer router (sglang-router, vllm-router), so that the peer relays the same token
// streams the null workers make for ferry-router: each streaming chat completion gets one
// `chat.completion.chunk` event (a one-word delta) every `token_interval`,
// all streams on one tick, until its max_tokens, then `data: [DONE]`. A token's event is padded
// (in its id) to `event_bytes`, the size of the event ferry-router writes, so both routers relay
// the same bytes. It answers what routers ask
// of a worker before they route to it (GET /health, /health_generate, /v1/models,
// /get_model_info, /get_server_info, /version: 200 with a small JSON body), and a non-streaming
// POST with one JSON completion. One thread, one epoll loop, HTTP/1.1 keep-alive, chunked
// answers, on 127.0.0.1 at an ephemeral port.
//
// Bounds: at most `max_connections` connections (more are closed at accept); a request head and
// body of at most 64 KiB (larger: 413 and close); a connection whose unsent output passes 1 MiB
// (a reader that stopped) is closed. Errors: a bad request gets 400 and is closed; nothing a
// client sends stops the loop.
//
// Threading: Start() runs the loop on its own thread; Stop() (or the destructor) ends and joins
// it. port() is fixed after Start().

#ifndef FERRY_TOOLS_BENCH_PACED_SSE_UPSTREAM_H_
#define FERRY_TOOLS_BENCH_PACED_SSE_UPSTREAM_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace ferry {

class PacedSseUpstream {
 public:
  static absl::StatusOr<std::unique_ptr<PacedSseUpstream>> Start(
      std::chrono::microseconds token_interval, int max_connections, size_t event_bytes);
  ~PacedSseUpstream();
  PacedSseUpstream(const PacedSseUpstream&) = delete;
  PacedSseUpstream& operator=(const PacedSseUpstream&) = delete;

  int port() const { return port_; }
  int64_t tokens_sent() const { return tokens_sent_.load(std::memory_order_relaxed); }
  void Stop();

 private:
  struct Connection;
  PacedSseUpstream(std::chrono::microseconds token_interval, int max_connections,
                   size_t event_bytes);
  void Loop();

  const std::chrono::microseconds token_interval_;
  const int max_connections_;
  const size_t event_bytes_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  std::atomic<int64_t> tokens_sent_{0};
  std::thread thread_;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_BENCH_PACED_SSE_UPSTREAM_H_
