// ferry bench frontdoor [--requests N] [--streams N] [--token_interval_ms T] [--workers W]
// [--seconds S] [--quick] [--scale_only] [--no_peer]: what the router's front door costs. A
// ferry-worker on the null engine at zero cost (no prefill or token time) streams as fast as the
// serving path allows; the same 1,000-token chat prompts reach it two ways in this run, one request
// at a time:
//   baseline: this process calls the worker's Generate directly (gRPC, the prompt's tokens made
//             here with the router's own prompt builder), time to the first token event;
//   router:   a ferry-router in front of it, an HTTP/1.1 streaming chat completion on a kept-alive
//             connection, time to the first SSE event.
// Added TTFT is router minus baseline, p50 and p99. The router's CPU time (every thread of the
// process, /proc schedstat, nanoseconds) is read around N requests of one token (the request
// path: parse, validate, template, tokenize, hash, route, first chunk) and around a few long
// streams (CPU per streamed token, the request path taken off), and set against the tokenizer's
// own time on the same prompt, measured here. Then 500 concurrent streams go through a second
// router in front of a worker that takes 20 ms a token, so that they are all open at once: all
// must end 200 with [DONE]. Goals (the issue's): added TTFT p50 <= 1 ms, request-path CPU <= 1.3x
// tokenize + 100 us, 500 streams held.
//
// Then the cluster-scale run: W ferry-workers on the null engine, each making one token per
// running request every T ms, behind one ferry-router, and N streaming chat completions driven by
// EpollSseClient (one thread of this process). Once every stream has its first token, a steady
// window of S seconds: tokens delivered (offered: N x 1000/T a second), the CPU of the router,
// each worker and this process (/proc schedstat of every thread), and every gap between two
// tokens of a stream inside the window. per_token_us is the router's CPU in the window over the
// tokens delivered in it; added_itl_p99_ms the p99 of (gap - T). When less than 0.98x of the
// offered load arrives, the run is repeated at half the streams (down to N/8) and the highest
// load sustained, and the highest rate delivered, are reported. The same run measures two
// baselines: the write floor (one event-sized write to each of N loopback sockets every T ms from
// one thread, its CPU per write) and a peer, sglang-router (--backend openai) relaying the same
// N streams from PacedSseUpstream, its CPU per relayed token measured the same way. Goals:
// per_token_us <= write floor + 3 us, <= the peer's, <= 5 us; added_itl_p99_ms <= 2.
// Prints a table, then one JSON line. Needs FERRY_MODEL_GGUF (the tokenizer and template; the
// null engine loads no weights).

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/mutex_mode.h"
#include "engine/gguf/gguf_file.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "router/api/openai_parser.h"
#include "router/api/prompt_builder.h"
#include "tests/integration/service_process.h"
#include "tools/bench/epoll_sse_client.h"
#include "tools/bench/paced_sse_upstream.h"
#include "tools/worker_cli/worker_client.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "frontdoor_bench: %s\n", what.c_str());
  std::exit(1);
}

// CPU seconds every thread of `pid` has run (the first field of each task's schedstat, in ns).
double ProcessCpuSeconds(pid_t pid) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) Die("cannot read " + dir);
  double ns = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream stat(absl::StrCat(dir, "/", e->d_name, "/schedstat"));
    double run = 0;
    if (stat >> run) ns += run;
  }
  closedir(d);
  return ns / 1e9;
}

// The floor under the router's cost per streamed token on this machine: a relay thread that
// sleeps until a small message arrives on one loopback socket (as a token's gRPC message does)
// and sends a small one on another, to a reader that sleeps until it arrives (as an SSE client
// does), one message at a time. Nothing else: no gRPC, no HTTP, no JSON. Returns the relay's CPU
// microseconds per message (its thread's CPU clock), over `messages`.
double RelayFloorUs(int messages) {
  // Loopback TCP, as the router's sockets: connected pairs (writer end first).
  auto tcp_pair = [](int fds[2]) {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      Die("relay listener");
    }
    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fds[0], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
    fds[1] = accept(listener, nullptr, nullptr);
    close(listener);
    const int one = 1;
    for (int i = 0; i < 2; ++i) setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  };
  int in[2], out[2];
  tcp_pair(in);
  tcp_pair(out);
  const std::string token(48, 't'), event(120, 'e');
  double relay_cpu_us = 0;
  std::thread relay([&] {
    char buf[4096];
    timespec t0, t1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    for (int i = 0; i < messages; ++i) {
      size_t got = 0;
      while (got < token.size()) {
        const ssize_t n = recv(in[1], buf, sizeof(buf), 0);
        if (n <= 0) Die("relay recv");
        got += static_cast<size_t>(n);
      }
      if (send(out[0], event.data(), event.size(), MSG_NOSIGNAL) != 120) Die("relay send");
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    relay_cpu_us = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / 1e3 / messages;
  });
  char buf[4096];
  for (int i = 0; i < messages; ++i) {  // the next token once the last event arrived
    if (send(in[0], token.data(), token.size(), MSG_NOSIGNAL) != 48) Die("source send");
    size_t got = 0;
    while (got < event.size()) {
      const ssize_t n = recv(out[1], buf, sizeof(buf), 0);
      if (n <= 0) Die("sink recv");
      got += static_cast<size_t>(n);
    }
  }
  relay.join();
  for (int* p : {in, out}) {
    close(p[0]);
    close(p[1]);
  }
  return relay_cpu_us;
}

// One kept-alive HTTP/1.1 connection to the router.
class HttpConnection {
 public:
  explicit HttpConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
    const int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~HttpConnection() { close(fd_); }

  // Posts a streaming chat completion; `ttft` gets the seconds to the first SSE event. Returns
  // whether the answer was a 200 that ended with [DONE]; `tokens` counts its content events.
  bool Stream(const std::string& body, double* ttft, int* events) {
    const std::string request = absl::StrCat(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
    const auto sent = Clock::now();
    if (write(fd_, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
      return false;
    }
    std::string got;
    bool first = false;
    char buf[65536];
    while (true) {
      const ssize_t n = read(fd_, buf, sizeof(buf));
      if (n <= 0) return false;
      got.append(buf, static_cast<size_t>(n));
      if (!first && got.find("data: ") != std::string::npos) {
        first = true;
        if (ttft != nullptr) *ttft = Since(sent);
      }
      if (got.size() >= 5 && got.compare(got.size() - 5, 5, "0\r\n\r\n") == 0 &&
          got.find("data: [DONE]") != std::string::npos) {
        break;
      }
    }
    if (got.compare(0, 12, "HTTP/1.1 200") != 0) return false;
    if (events != nullptr) {
      *events = 0;
      for (size_t at = got.find("\"content\":\""); at != std::string::npos;
           at = got.find("\"content\":\"", at + 1)) {
        if (got.compare(at + 11, 1, "\"") != 0) ++*events;  // not the role chunk's ""
      }
    }
    return true;
  }

 private:
  int fd_ = -1;
};

std::string ChatBody(const std::string& content, int max_tokens) {
  return nlohmann::json{{"model", "smol"},
                        {"messages", {{{"role", "user"}, {"content", content}}}},
                        {"max_tokens", max_tokens},
                        {"temperature", 0},
                        {"stream", true}}
      .dump();
}

// The part of the bench that came first: TTFT through the router against the worker's gRPC, the
// router's CPU per request and per token of one stream, 500 streams held. Prints its table and
// adds its keys and goals to `j` and `goals`.
void RunClassic(const std::string& router_bin, const std::string& worker_bin,
                const std::string& model, int requests, nlohmann::ordered_json* out,
                nlohmann::ordered_json* goals) {
  // The router's own prompt pipeline, here: the tokens the worker gets, and the tokenizer's time.
  auto gguf = GgufFile::Open(model);
  if (!gguf.ok()) Die(std::string(gguf.status().message()));
  auto tokenizer = Tokenizer::FromGguf(**gguf);
  auto chat = ChatTemplate::FromGguf(**gguf);
  if (!tokenizer.ok() || !chat.ok()) Die("the model's tokenizer or template");
  PromptBuilder builder(tokenizer->get(), chat->get());
  ApiLimits limits;
  limits.model = "smol";
  limits.vocab_size = static_cast<int64_t>((*tokenizer)->vocab_size());
  std::string filler;
  const std::string sentence =
      "The engineer reads the service logs, compares the latency histograms and writes down "
      "what changed between the two deployments of the router. ";
  while (true) {
    ApiRequest r;
    if (!ParseChatCompletion(ChatBody("Request 0: " + filler, 1), limits, &r).status.ok()) {
      Die("parse");
    }
    BuiltPrompt p;
    if (!builder.Build(r, 8192, &p).status.ok()) Die("build");
    if (p.tokens.size() >= 1000) break;
    filler += sentence;
  }
  auto prompt_text = [&](int i) { return absl::StrCat("Request ", i, ": ", filler); };
  auto prompt_tokens = [&](int i) {
    ApiRequest r;
    ParseChatCompletion(ChatBody(prompt_text(i), 1), limits, &r);
    BuiltPrompt p;
    builder.Build(r, 8192, &p);
    return p.tokens;
  };
  // The tokenizer alone on the rendered prompt (what the router's tokenize step does).
  ApiRequest sample;
  ParseChatCompletion(ChatBody(prompt_text(1), 1), limits, &sample);
  ChatTemplateInputs inputs = TemplateInputs(sample, ToolSetup{});
  auto rendered = (*chat)->Apply(inputs);
  if (!rendered.ok()) Die("render");
  std::vector<double> tokenize;
  size_t prompt_length = 0;
  for (int i = 0; i < 200; ++i) {
    const auto t = Clock::now();
    auto ids = (*tokenizer)->Encode(PromptSegments(*rendered));
    tokenize.push_back(Since(t));
    prompt_length = ids->size();
  }
  const double tokenize_us = Percentile(tokenize, 0.5) * 1e6;

  const std::vector<std::string> common = {
      "--model=" + model,  "--engine=null",          "--null_prefill_tokens_per_second=0",
      "--block_tokens=16", "--kv_pool_bytes=256MiB", "--max_running=600",
      "--max_queued=1024", "--max_batch_tokens=4096"};
  std::vector<std::string> fast = common, slow = common;
  fast.push_back("--null_token_seconds=0");
  slow.push_back("--null_token_seconds=0.02");
  ServiceProcess worker(worker_bin, fast);
  ServiceProcess slow_worker(worker_bin, slow);
  if (!worker.ready() || !slow_worker.ready()) Die("a worker did not start: " + worker.LogTail());
  auto start_router = [&](const ServiceProcess& w) {
    return std::make_unique<ServiceProcess>(
        router_bin, std::vector<std::string>{"--model=" + model, "--served_model_name=smol",
                                             "--workers=" + w.address(), "--max_queued=1024",
                                             "--max_connections=2048", "--threads=2"});
  };
  auto router = start_router(worker);
  auto slow_router = start_router(slow_worker);
  if (!router->ready() || !slow_router->ready())
    Die("a router did not start: " + router->LogTail());
  for (int i = 0; i < 500; ++i) {  // until the routers see their workers
    HttpConnection c(router->grpc_port()), d(slow_router->grpc_port());
    if (c.Stream(ChatBody("warm up", 1), nullptr, nullptr) &&
        d.Stream(ChatBody("warm up", 1), nullptr, nullptr)) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // 1. TTFT, one request at a time, the two paths alternating.
  WorkerClient direct(worker.address());
  HttpConnection http(router->grpc_port());
  std::vector<double> ttft_router, ttft_direct;
  for (int i = 0; i < requests; ++i) {
    v1::GenerateRequest g;
    g.set_aggregated(true);
    v1::TokenizedRequest* t = g.mutable_request();
    t->mutable_context()->set_request_id(absl::StrCat("d", i));
    for (TokenId id : prompt_tokens(10000 + i)) t->add_prompt_token_ids(id);
    t->mutable_sampling()->set_temperature(0);
    t->mutable_sampling()->set_max_tokens(1);
    const auto sent = Clock::now();
    double ttft = -1;
    GenerateResult got = direct.Generate(g, absl::Seconds(60), [&](const v1::GenerateEvent& e) {
      if (ttft < 0 && e.has_tokens() && e.tokens().token_ids_size() > 0) ttft = Since(sent);
      return true;
    });
    if (!got.status.ok() || ttft < 0) Die("direct Generate: " + got.status.error_message());
    ttft_direct.push_back(ttft);
    if (!http.Stream(ChatBody(prompt_text(20000 + i), 1), &ttft, nullptr)) Die("router stream");
    ttft_router.push_back(ttft);
  }
  const double added_p50 = (Percentile(ttft_router, 0.5) - Percentile(ttft_direct, 0.5)) * 1e3;
  const double added_p99 = (Percentile(ttft_router, 0.99) - Percentile(ttft_direct, 0.99)) * 1e3;

  // 2. The router's CPU per request (one token each) and per streamed token.
  const int cpu_requests = std::max(requests, 500);
  double cpu0 = ProcessCpuSeconds(router->pid());
  for (int i = 0; i < cpu_requests; ++i) {
    if (!http.Stream(ChatBody(prompt_text(30000 + i), 1), nullptr, nullptr)) Die("router stream");
  }
  const double request_cpu_us = (ProcessCpuSeconds(router->pid()) - cpu0) / cpu_requests * 1e6;
  const int long_requests = 10, long_tokens = 2000;
  int64_t streamed = 0;
  cpu0 = ProcessCpuSeconds(router->pid());
  for (int i = 0; i < long_requests; ++i) {
    int events = 0;
    if (!http.Stream(ChatBody(prompt_text(40000 + i), long_tokens), nullptr, &events)) {
      Die("long stream");
    }
    streamed += events;
  }
  const double long_cpu = ProcessCpuSeconds(router->pid()) - cpu0;
  const double per_token_us = std::max(0.0, long_cpu - long_requests * request_cpu_us / 1e6) /
                              std::max<int64_t>(1, streamed) * 1e6;
  const double floor_us = RelayFloorUs(20000);

  // 3. 500 streams at once through the slow worker's router.
  const int streams = 500;
  std::atomic<int> ok{0}, open{0}, peak{0};
  std::atomic<int64_t> concurrent_events{0};
  std::vector<std::thread> clients;
  cpu0 = ProcessCpuSeconds(slow_router->pid());
  for (int i = 0; i < streams; ++i) {
    clients.emplace_back([&, i] {
      HttpConnection c(slow_router->grpc_port());
      const int now = ++open;
      for (int p = peak.load(); now > p && !peak.compare_exchange_weak(p, now);) {
      }
      int events = 0;
      if (c.Stream(ChatBody(absl::StrCat("stream ", i), 50), nullptr, &events) && events > 0) {
        ++ok;
      }
      concurrent_events += events;
      --open;
    });
  }
  for (auto& t : clients) t.join();
  // Everything the router spent on them (requests included) per streamed event: the tokens of
  // 500 streams reach it together, one worker step at a time.
  const double concurrent_per_token_us = (ProcessCpuSeconds(slow_router->pid()) - cpu0) /
                                         std::max<int64_t>(1, concurrent_events.load()) * 1e6;

  const double request_goal_us = 1.3 * tokenize_us + 100;
  std::printf("ferry bench frontdoor: %zu-token chat prompt, %d requests a path, null engine\n\n",
              prompt_length, requests);
  std::printf("%-34s %12s %12s\n", "", "p50", "p99");
  std::printf("%-34s %9.3f ms %9.3f ms\n", "TTFT direct (gRPC Generate)",
              Percentile(ttft_direct, 0.5) * 1e3, Percentile(ttft_direct, 0.99) * 1e3);
  std::printf("%-34s %9.3f ms %9.3f ms\n", "TTFT through the router (HTTP SSE)",
              Percentile(ttft_router, 0.5) * 1e3, Percentile(ttft_router, 0.99) * 1e3);
  std::printf("%-34s %9.3f ms %9.3f ms   goal p50 <= 1 ms\n", "added by the router", added_p50,
              added_p99);
  std::printf(
      "\nrouter CPU per request (1 token):  %8.1f us   goal <= 1.3 x tokenize + 100 = %.1f us"
      " (%.2fx of it)\n",
      request_cpu_us, request_goal_us, request_cpu_us / request_goal_us);
  std::printf("tokenizer on the same prompt:      %8.1f us\n", tokenize_us);
  std::printf("router CPU per token, one stream:  %8.2f us   (%lld tokens)\n", per_token_us,
              static_cast<long long>(streamed));
  std::printf(
      "  floor: sleep, recv, send a relay:  %8.2f us   (one message in, one out, no gRPC/HTTP;"
      " %.2fx of it)\n",
      floor_us, per_token_us / floor_us);
  std::printf(
      "concurrent streams:                %5d of %d ended 200 with [DONE] (%d open at "
      "once at most)\n",
      ok.load(), streams, peak.load());
  std::printf("router CPU per token, 500 streams: %8.2f us   (requests included; %lld tokens)\n\n",
              concurrent_per_token_us, static_cast<long long>(concurrent_events.load()));
  nlohmann::ordered_json& j = *out;
  j["prompt_tokens"] = prompt_length;
  j["requests"] = requests;
  j["direct_ttft_p50_ms"] = Percentile(ttft_direct, 0.5) * 1e3;
  j["router_ttft_p50_ms"] = Percentile(ttft_router, 0.5) * 1e3;
  j["added_ttft_p50_ms"] = added_p50;
  j["added_ttft_p99_ms"] = added_p99;
  j["request_cpu_us"] = request_cpu_us;
  j["tokenize_us"] = tokenize_us;
  j["request_cpu_ratio_to_goal"] = request_cpu_us / request_goal_us;
  j["one_stream_per_token_us"] = per_token_us;
  j["per_token_floor_us"] = floor_us;
  j["streams_held"] = ok.load();
  j["concurrent_per_token_us"] = concurrent_per_token_us;
  (*goals)["added_ttft_p50"] = added_p50 <= 1.0;
  (*goals)["request_cpu"] = request_cpu_us <= request_goal_us;
  (*goals)["streams"] = ok.load() == streams;
}

// --- The cluster-scale run -------------------------------------------------------------------

struct Options {
  std::string router_bin, worker_bin, model;
  int requests = 300;
  int streams = 2000;
  double interval_ms = 25;
  int workers = 4;
  double seconds = 10;
  bool scale_only = false;
  bool peer = true;
};

// What one driven load measured over its steady window.
struct Drive {
  int streams = 0;
  int started = 0;  // streams with a first token before the window opened
  int failed = 0;
  std::string first_error;
  double window_s = 0;
  int64_t window_tokens = 0;
  double offered = 0;       // tokens/s
  double delivered = 0;     // tokens/s
  double made = 0;          // tokens/s the workers (or the upstream) made in the window
  double target_cpu_s = 0;  // the router (ferry's or the peer) in the window
  double others_cpu_s = 0;  // the workers or the upstream's process
  std::vector<double> each_other_cpu_s;
  double client_cpu_s = 0;  // this process (the epoll client's thread and the rest)
  double added_itl_p50_ms = 0, added_itl_p99_ms = 0;
  int64_t event_bytes = 0;  // one token's SSE event as the client read it
  bool sustained() const { return delivered >= 0.98 * offered; }
  double per_token_us() const {
    return window_tokens > 0 ? target_cpu_s / static_cast<double>(window_tokens) * 1e6 : -1;
  }
};

// The tokens a stream must be asked for to outlast the ramp and the window.
// At most 7,000: the prompt and the answer stay within SmolLM2's 8,192 positions (at T of a few
// ms a stream may then end before a long window does; its tokens stop counting).
int64_t StreamTokens(const Options& o, int streams) {
  const double ramp_s = 30 + streams / 100.0;
  return std::min<int64_t>(7000,
                           static_cast<int64_t>((ramp_s + o.seconds + 10) * 1000 / o.interval_ms));
}

// `streams` streaming chat completions to 127.0.0.1:port from one epoll thread; once every one
// has its first token (or the ramp's deadline passed: then `started` says how many had), a window
// of o.seconds: tokens, the CPU of `target` (the router) and of `others` (what feeds it) and of
// this process, and each stream's gaps between tokens inside the window.
// `made` counts the tokens made upstream so far (the workers' metrics, the upstream's counter).
Drive DriveStreams(const Options& o, int port, int streams, pid_t target,
                   const std::vector<pid_t>& others, const std::function<double()>& made) {
  Drive d;
  d.streams = streams;
  d.offered = streams * 1000.0 / o.interval_ms;
  const int64_t max_tokens = StreamTokens(o, streams);
  EpollSseClientOptions co;
  co.port = port;
  co.streams = streams;
  co.body = [&](int i) {
    return ChatBody(absl::StrCat("stream ", i, ": say something"), max_tokens);
  };
  co.max_arrivals_per_stream = static_cast<size_t>(max_tokens);
  auto client = EpollSseClient::Create(co);
  if (!client.ok()) Die(std::string(client.status().message()));
  absl::Status run_status;
  std::thread loop([&] { run_status = (*client)->Run(); });
  const auto ramp_deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>((30 + streams / 100.0) * 1e3));
  while (Clock::now() < ramp_deadline && (*client)->streams_started() < streams &&
         (*client)->streams_started() + (*client)->streams_ended() < streams) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  d.started = (*client)->streams_started();
  // A few intervals more, so that the last streams to start are past their first gap.
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(4 * o.interval_ms)));
  const auto t0 = Clock::now();
  const int64_t tokens0 = (*client)->tokens();
  const double made0 = made();
  const double target0 = ProcessCpuSeconds(target), self0 = ProcessCpuSeconds(getpid());
  std::vector<double> others0;
  for (pid_t p : others) others0.push_back(ProcessCpuSeconds(p));
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(o.seconds * 1e3)));
  const auto t1 = Clock::now();
  const int64_t tokens1 = (*client)->tokens();
  const double made1 = made();
  d.target_cpu_s = ProcessCpuSeconds(target) - target0;
  d.client_cpu_s = ProcessCpuSeconds(getpid()) - self0;
  for (size_t i = 0; i < others.size(); ++i) {
    d.each_other_cpu_s.push_back(ProcessCpuSeconds(others[i]) - others0[i]);
    d.others_cpu_s += d.each_other_cpu_s.back();
  }
  (*client)->Stop();
  loop.join();
  if (!run_status.ok()) Die("the epoll client: " + std::string(run_status.message()));
  d.window_s = std::chrono::duration<double>(t1 - t0).count();
  d.window_tokens = tokens1 - tokens0;
  d.delivered = static_cast<double>(d.window_tokens) / d.window_s;
  d.made = (made1 - made0) / d.window_s;
  std::vector<double> added;
  for (int i = 0; i < streams; ++i) {
    const EpollSseClient::Stream& s = (*client)->stream(i);
    if (s.failed) {
      if (d.failed++ == 0) d.first_error = s.error;
    }
    if (d.event_bytes == 0) d.event_bytes = s.event_bytes;
    for (size_t k = 1; k < s.arrivals.size(); ++k) {
      if (s.arrivals[k - 1] < t0 || s.arrivals[k] > t1) continue;
      added.push_back(
          std::chrono::duration<double, std::milli>(s.arrivals[k] - s.arrivals[k - 1]).count() -
          o.interval_ms);
    }
  }
  d.added_itl_p50_ms = Percentile(added, 0.5);
  d.added_itl_p99_ms = Percentile(added, 0.99);
  return d;
}

// W null workers pacing one token per request every interval, one ferry-router in front of all.
Drive RunFerryScale(const Options& o, int streams) {
  const int per_worker = (streams + o.workers - 1) / o.workers + 16;
  // The null engine's KV is 16 bytes a token: 512 MiB holds every row's whole stream.
  std::vector<std::string> flags = {
      "--model=" + o.model,
      "--engine=null",
      "--null_prefill_tokens_per_second=0",
      absl::StrCat("--null_token_seconds=", o.interval_ms / 1e3),
      "--block_tokens=16",
      "--kv_pool_bytes=512MiB",
      absl::StrCat("--max_running=", per_worker),
      absl::StrCat("--max_queued=", streams),
      absl::StrCat("--max_batch_tokens=", std::max<int64_t>(8192, per_worker * 64))};
  std::vector<std::unique_ptr<ServiceProcess>> workers;
  std::vector<std::string> addresses;
  std::vector<pid_t> pids;
  for (int i = 0; i < o.workers; ++i) {
    workers.push_back(std::make_unique<ServiceProcess>(o.worker_bin, flags));
    if (!workers.back()->ready()) Die("a null worker did not start: " + workers.back()->LogTail());
    addresses.push_back(workers.back()->address());
    pids.push_back(workers.back()->pid());
  }
  ServiceProcess router(o.router_bin,
                        {"--model=" + o.model, "--served_model_name=smol",
                         "--workers=" + absl::StrJoin(addresses, ","), "--policy=round_robin",
                         absl::StrCat("--max_queued=", streams + 64),
                         absl::StrCat("--max_connections=", streams + 256)});
  if (!router.ready()) Die("the scale router did not start: " + router.LogTail());
  const std::string up = "ferry_router_workers{state=\"up\"}";
  if (!WaitUntil([&] { return MetricValue(router.admin_port(), up) >= o.workers; },
                 absl::Seconds(60))) {
    // Its metric may have been renamed: go on, the streams say whether the workers serve.
    std::printf("  the router's %s did not reach %d in 60 s; going on\n", up.c_str(), o.workers);
  }
  auto made = [&] {
    double sum = 0;
    for (const auto& w : workers) {
      sum += std::max(0.0, MetricValue(w->admin_port(), "ferry_worker_generated_tokens_total"));
    }
    return sum;
  };
  Drive d = DriveStreams(o, router.grpc_port(), streams, router.pid(), pids, made);
  return d;
}

// The floor under a streamed token's write at this load: one thread writes an `event_bytes`
// message to each of `streams` loopback TCP sockets every interval (what any front door must do
// at least), a second thread drains the other ends with epoll. The writer's CPU clock per write.
double WriteFloorUs(const Options& o, int streams, int64_t event_bytes) {
  std::vector<int> writers, readers;
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 4096) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("write floor listener");
  }
  const int one = 1;
  for (int i = 0; i < streams; ++i) {
    const int w = socket(AF_INET, SOCK_STREAM, 0);
    if (w < 0 || connect(w, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Die("write floor connect");
    }
    const int r = accept(listener, nullptr, nullptr);
    if (r < 0) Die("write floor accept");
    setsockopt(w, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fcntl(w, F_SETFL, O_NONBLOCK);
    fcntl(r, F_SETFL, O_NONBLOCK);
    writers.push_back(w);
    readers.push_back(r);
  }
  close(listener);
  const int ep = epoll_create1(0);
  for (int i = 0; i < streams; ++i) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = readers[static_cast<size_t>(i)];
    epoll_ctl(ep, EPOLL_CTL_ADD, readers[static_cast<size_t>(i)], &ev);
  }
  std::atomic<bool> done{false};
  std::thread reader([&] {
    std::vector<epoll_event> ready(1024);
    char buf[65536];
    while (!done.load()) {
      const int n = epoll_wait(ep, ready.data(), static_cast<int>(ready.size()), 50);
      for (int k = 0; k < n; ++k) {
        while (recv(ready[k].data.fd, buf, sizeof(buf), 0) > 0) {
        }
      }
    }
  });
  const std::string message(static_cast<size_t>(std::max<int64_t>(16, event_bytes)), 'e');
  const double seconds = std::max(2.0, std::min(o.seconds, 5.0));
  int64_t writes = 0;
  double cpu_us = 0;
  std::thread writer([&] {
    timespec c0, c1;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    const auto interval = std::chrono::microseconds(static_cast<int64_t>(o.interval_ms * 1e3));
    const auto end = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1e3));
    for (auto tick = Clock::now(); tick < end; tick += interval) {
      std::this_thread::sleep_until(tick);
      for (int w : writers) {
        if (send(w, message.data(), message.size(), MSG_NOSIGNAL) > 0) ++writes;
      }
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    cpu_us = ((c1.tv_sec - c0.tv_sec) * 1e9 + (c1.tv_nsec - c0.tv_nsec)) / 1e3;
  });
  writer.join();
  done = true;
  reader.join();
  close(ep);
  for (int fd : writers) close(fd);
  for (int fd : readers) close(fd);
  return writes > 0 ? cpu_us / static_cast<double>(writes) : -1;
}

// The peer router: sglang-router (its `--backend openai` relays any OpenAI-compatible upstream)
// from a bench-owned venv, $FERRY_CACHE/venv/bench-router, made on first use.
struct Peer {
  std::string name;  // "sglang-router", empty when it could not run
  std::string why;   // why not
  Drive drive;
};

int Shell(const std::string& command) { return std::system(command.c_str()); }

int FreePort() {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  close(s);
  return ntohs(addr.sin_port);
}

bool HttpConnects(int port) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(s);
  return ok;
}

Peer RunPeer(const Options& o, int streams, int64_t event_bytes) {
  Peer peer;
  const char* cache = std::getenv("FERRY_CACHE");
  const std::string venv =
      absl::StrCat(cache != nullptr ? cache : "/var/cache/ferry", "/venv/bench-router");
  const std::string python = venv + "/bin/python";
  if (access(python.c_str(), X_OK) != 0 ||
      Shell(python + " -c 'import sglang_router' >/dev/null 2>&1") != 0) {
    std::printf("peer: installing sglang-router into %s\n", venv.c_str());
    std::fflush(stdout);
    if (Shell(absl::StrCat("/usr/bin/python3 -m venv ", venv, " && ", venv,
                           "/bin/pip install -q sglang-router==0.3.2 >&2")) != 0) {
      peer.why = "could not install sglang-router (pip) into " + venv;
      return peer;
    }
  }
  auto upstream =
      PacedSseUpstream::Start(std::chrono::microseconds(static_cast<int64_t>(o.interval_ms * 1e3)),
                              streams + 256, static_cast<size_t>(event_bytes));
  if (!upstream.ok()) {
    peer.why = std::string(upstream.status().message());
    return peer;
  }
  const int port = FreePort(), metrics_port = FreePort();
  const std::string log = absl::StrCat("/tmp/frontdoor_bench_peer.", getpid(), ".log");
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    const std::string worker = absl::StrCat("http://127.0.0.1:", (*upstream)->port());
    const std::string port_s = std::to_string(port), metrics_s = std::to_string(metrics_port);
    const std::string concurrent = std::to_string(streams + 256);
    execl(python.c_str(), python.c_str(), "-m", "sglang_router.launch_router", "--host",
          "127.0.0.1", "--port", port_s.c_str(), "--backend", "openai", "--worker-urls",
          worker.c_str(), "--policy", "round_robin", "--prometheus-port", metrics_s.c_str(),
          "--max-concurrent-requests", concurrent.c_str(), "--queue-size", concurrent.c_str(),
          "--disable-retries", "--disable-circuit-breaker", "--log-level", "warn",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid < 0) {
    peer.why = "fork";
    return peer;
  }
  auto tail = [&] {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return text.size() > 1500 ? text.substr(text.size() - 1500) : text;
  };
  bool ready = WaitUntil(
      [&] {
        std::string body;
        return HttpConnects(port) &&
               HttpPost(port, "/v1/chat/completions", ChatBody("warm up", 2), {}, &body) == 200;
      },
      absl::Seconds(60));
  if (!ready) {
    peer.why = "sglang-router did not relay a warm-up request within 60 s: " + tail();
  } else {
    peer.name = "sglang-router";
    peer.drive = DriveStreams(o, port, streams, pid, {},
                              [&] { return static_cast<double>((*upstream)->tokens_sent()); });
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  if (!peer.name.empty()) unlink(log.c_str());
  return peer;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// --name value, --name=value; --quick, --scale_only, --no_peer.
Options ParseFlags(int argc, char** argv) {
  Options o;
  o.router_bin = argv[1];
  o.worker_bin = argv[2];
  bool seconds_set = false, streams_set = false;
  for (int i = 3; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg == "--quick") {
      if (!streams_set) o.streams = 400;
      if (!seconds_set) o.seconds = 5;
      continue;
    }
    if (arg == "--scale_only") {
      o.scale_only = true;
      continue;
    }
    if (arg == "--no_peer") {
      o.peer = false;
      continue;
    }
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Die("flag " + arg + " needs a value");
    }
    double v = 0;
    if (!absl::SimpleAtod(value, &v)) Die(arg + " takes a number, not '" + value + "'");
    if (arg == "--requests") {
      o.requests = std::max(20, static_cast<int>(v));
    } else if (arg == "--streams") {
      if (v < 1 || v > 8000) Die("--streams must be in [1, 8000]");
      o.streams = static_cast<int>(v);
      streams_set = true;
    } else if (arg == "--token_interval_ms") {
      if (v < 1 || v > 10000) Die("--token_interval_ms must be in [1, 10000]");
      o.interval_ms = v;
    } else if (arg == "--workers") {
      if (v < 1 || v > 64) Die("--workers must be in [1, 64]");
      o.workers = static_cast<int>(v);
    } else if (arg == "--seconds") {
      if (v < 1 || v > 600) Die("--seconds must be in [1, 600]");
      o.seconds = v;
      seconds_set = true;
    } else {
      Die("unknown flag " + arg +
          " (--requests, --streams, --token_interval_ms, --workers, --seconds, --quick, "
          "--scale_only, --no_peer)");
    }
  }
  if (o.streams < o.workers) Die("--streams must be at least --workers");
  return o;
}

// Soft limit of open files to the hard one: N client sockets here, N in the router (a child
// inherits the limit), 2N for the write floor.
void RaiseFileLimit(int streams) {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return;
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
  if (r.rlim_cur < static_cast<rlim_t>(2 * streams + 512)) {
    Die(absl::StrCat("open files limited to ", r.rlim_cur, ": --streams ", streams, " needs ",
                     2 * streams + 512));
  }
}

int Main(int argc, char** argv) {
  UseProgramMutexMode();
  if (argc < 3) {
    Die("usage: frontdoor_bench FERRY_ROUTER FERRY_WORKER [--requests N] [--streams N] "
        "[--token_interval_ms T] [--workers W] [--seconds S] [--quick] [--scale_only] "
        "[--no_peer]");
  }
  Options o = ParseFlags(argc, argv);
  const char* gguf_path = std::getenv("FERRY_MODEL_GGUF");
  if (gguf_path == nullptr) Die("FERRY_MODEL_GGUF is not set (./ferry bench sets it)");
  o.model = gguf_path;
  RaiseFileLimit(o.streams);

  nlohmann::ordered_json j, goals;
  j["bench"] = "frontdoor";
  if (!o.scale_only) RunClassic(o.router_bin, o.worker_bin, o.model, o.requests, &j, &goals);

  // The scale run at the streams asked for; if the machine cannot deliver them, again at half
  // the streams until a load is delivered (or 1/8 of them), the highest delivered one reported.
  std::printf("scale: %d streams, a token every %g ms each, %d null workers, %g s window\n",
              o.streams, o.interval_ms, o.workers, o.seconds);
  std::fflush(stdout);
  const Drive d = RunFerryScale(o, o.streams);
  Drive last = d, best = d;  // the last run; the one that delivered the most
  for (int s = o.streams / 2; !last.sustained() && s >= std::max(o.workers, o.streams / 8);
       s /= 2) {
    std::printf("  delivered %.0f of %.0f tokens/s offered (< 0.98x): again at %d streams\n",
                last.delivered, last.offered, s);
    std::fflush(stdout);
    last = RunFerryScale(o, s);
    if (last.delivered > best.delivered) best = last;
  }
  const bool any_sustained = last.sustained();
  const double floor_us = WriteFloorUs(o, o.streams, d.event_bytes);
  Peer peer;
  if (o.peer) {
    peer = RunPeer(o, o.streams, d.event_bytes);
  } else {
    peer.why = "--no_peer";
  }
  const double per_token_us = d.per_token_us();
  const bool peer_ran = !peer.name.empty() && peer.drive.window_tokens > 0;
  const double peer_us = peer_ran ? peer.drive.per_token_us() : -1;

  std::printf("\n%-44s %12s %12s\n", "scale run", "ferry", peer_ran ? peer.name.c_str() : "peer");
  auto row = [&](const char* name, const std::string& a, const std::string& b) {
    std::printf("%-44s %12s %12s\n", name, a.c_str(), peer_ran ? b.c_str() : "-");
  };
  row("streams (with a first token)", absl::StrCat(d.started, "/", d.streams),
      absl::StrCat(peer.drive.started, "/", peer.drive.streams));
  row("offered tokens/s", Fixed(d.offered, 0), Fixed(peer.drive.offered, 0));
  row("tokens/s made by the workers / upstream", Fixed(d.made, 0), Fixed(peer.drive.made, 0));
  row("delivered tokens/s", Fixed(d.delivered, 0), Fixed(peer.drive.delivered, 0));
  row("router CPU per token (us)", Fixed(per_token_us, 2), Fixed(peer_us, 2));
  row("router CPU cores", Fixed(d.target_cpu_s / d.window_s, 2),
      Fixed(peer.drive.target_cpu_s / std::max(1e-9, peer.drive.window_s), 2));
  row("workers / upstream CPU per token (us)",
      Fixed(d.others_cpu_s / std::max<int64_t>(1, d.window_tokens) * 1e6, 2), "-");
  row("client CPU per token (us)",
      Fixed(d.client_cpu_s / std::max<int64_t>(1, d.window_tokens) * 1e6, 2),
      Fixed(peer.drive.client_cpu_s / std::max<int64_t>(1, peer.drive.window_tokens) * 1e6, 2));
  row("added ITL p50 (ms, gap - interval)", Fixed(d.added_itl_p50_ms, 2),
      Fixed(peer.drive.added_itl_p50_ms, 2));
  row("added ITL p99 (ms, gap - interval)", Fixed(d.added_itl_p99_ms, 2),
      Fixed(peer.drive.added_itl_p99_ms, 2));
  row("failed streams", std::to_string(d.failed), std::to_string(peer.drive.failed));
  for (size_t i = 0; i < d.each_other_cpu_s.size(); ++i) {
    std::printf("  worker %zu CPU cores: %.2f\n", i, d.each_other_cpu_s[i] / d.window_s);
  }
  if (d.failed > 0) std::printf("  first failure: %s\n", d.first_error.c_str());
  std::printf(
      "write floor: one %lld-byte write to each of %d loopback sockets every %g ms: %.2f us"
      " a write\n",
      static_cast<long long>(d.event_bytes), o.streams, o.interval_ms, floor_us);
  if (!d.sustained()) {
    std::printf(
        "this machine could not deliver the offered load: %.0f of %.0f tokens/s (%.2fx); the "
        "workers made %.0f tokens/s (%.2fx of offered), the router delivered %.2fx of what they "
        "made.\n",
        d.delivered, d.offered, d.delivered / d.offered, d.made, d.made / d.offered,
        d.delivered / std::max(1.0, d.made));
    if (any_sustained) {
      std::printf("the highest load it sustained (>= 0.98x offered): %d streams, %.0f tokens/s\n",
                  last.streams, last.delivered);
    } else {
      std::printf("no load down to %d streams was delivered in full (>= 0.98x offered); ",
                  last.streams);
    }
    std::printf("the highest rate delivered: %.0f tokens/s at %d streams\n", best.delivered,
                best.streams);
  }
  if (!peer_ran) std::printf("peer: none ran (%s)\n", peer.why.c_str());
  std::printf(
      "goals: per token <= write floor + 3 us = %.2f us, <= the peer's, <= 5 us; added "
      "ITL p99 <= 2 ms\n\n",
      floor_us + 3);

  auto number_or_null = [](bool ok, double v) {
    return ok ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
  };
  j["streams"] = o.streams;
  j["token_interval_ms"] = o.interval_ms;
  j["workers"] = o.workers;
  j["window_s"] = d.window_s;
  j["streams_started"] = d.started;
  j["failed_streams"] = d.failed;
  j["offered_tokens_per_s"] = d.offered;
  j["delivered_tokens_per_s"] = d.delivered;
  j["worker_tokens_per_s"] = d.made;
  j["load_delivered"] = d.sustained();
  j["sustained_streams"] = number_or_null(any_sustained, last.streams);
  j["sustained_tokens_per_s"] = number_or_null(any_sustained, last.delivered);
  j["highest_delivered_streams"] = best.streams;
  j["highest_delivered_tokens_per_s"] = best.delivered;
  j["per_token_us"] = number_or_null(d.window_tokens > 0, per_token_us);
  j["router_cores"] = d.target_cpu_s / d.window_s;
  j["worker_cpu_per_token_us"] = d.others_cpu_s / std::max<int64_t>(1, d.window_tokens) * 1e6;
  j["client_cpu_per_token_us"] = d.client_cpu_s / std::max<int64_t>(1, d.window_tokens) * 1e6;
  j["event_bytes"] = d.event_bytes;
  j["write_floor_us"] = floor_us;
  j["peer"] = peer_ran ? nlohmann::ordered_json(peer.name) : nullptr;
  j["peer_per_token_us"] = number_or_null(peer_ran, peer_us);
  j["peer_delivered_tokens_per_s"] = number_or_null(peer_ran, peer.drive.delivered);
  j["peer_added_itl_p99_ms"] = number_or_null(peer_ran, peer.drive.added_itl_p99_ms);
  j["added_itl_p50_ms"] = d.added_itl_p50_ms;
  j["added_itl_p99_ms"] = d.added_itl_p99_ms;
  goals["per_token"] = d.window_tokens > 0 && per_token_us <= 5.0;
  goals["per_token_vs_write_floor"] = d.window_tokens > 0 && per_token_us <= floor_us + 3;
  goals["per_token_vs_peer"] =
      peer_ran ? nlohmann::ordered_json(per_token_us <= peer_us) : nlohmann::ordered_json(nullptr);
  goals["added_itl_p99"] = d.window_tokens > 0 && d.added_itl_p99_ms <= 2.0;
  j["goals_met"] = goals;
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
