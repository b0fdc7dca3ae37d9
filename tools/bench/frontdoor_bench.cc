// ferry bench frontdoor [--requests N]: what the router's front door costs. A ferry-worker on the
// null engine at zero cost (no prefill or token time) streams as fast as the serving path allows;
// the same 1,000-token chat prompts reach it two ways in this run, one request at a time:
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
// tokenize + 100 us, <= 5 us per streamed token, 500 streams held. Prints a table, then one JSON
// line. Needs FERRY_MODEL_GGUF (the tokenizer and template; the null engine loads no weights).

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/mutex_mode.h"
#include "engine/gguf/gguf_file.h"
#include "engine/template/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "router/api/openai_parser.h"
#include "router/api/prompt_builder.h"
#include "tests/integration/service_process.h"
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

std::vector<std::string> Flag(int argc, char** argv, const std::string& name) {
  std::vector<std::string> out;
  for (int i = 1; i + 1 < argc; ++i) {
    if (argv[i] == "--" + name) out.push_back(argv[i + 1]);
  }
  return out;
}

int Main(int argc, char** argv) {
  UseProgramMutexMode();
  if (argc < 3) Die("usage: frontdoor_bench FERRY_ROUTER FERRY_WORKER [--requests N]");
  const std::string router_bin = argv[1], worker_bin = argv[2];
  int requests = 300;
  if (auto v = Flag(argc, argv, "requests"); !v.empty())
    requests = std::max(20, std::atoi(v[0].c_str()));
  const char* gguf_path = std::getenv("FERRY_MODEL_GGUF");
  if (gguf_path == nullptr) Die("FERRY_MODEL_GGUF is not set (./ferry bench sets it)");
  const std::string model = gguf_path;

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
  std::printf("router CPU per streamed token:     %8.2f us   goal <= 5 us (%lld tokens)\n",
              per_token_us, static_cast<long long>(streamed));
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
  nlohmann::ordered_json j;
  j["bench"] = "frontdoor";
  j["prompt_tokens"] = prompt_length;
  j["requests"] = requests;
  j["direct_ttft_p50_ms"] = Percentile(ttft_direct, 0.5) * 1e3;
  j["router_ttft_p50_ms"] = Percentile(ttft_router, 0.5) * 1e3;
  j["added_ttft_p50_ms"] = added_p50;
  j["added_ttft_p99_ms"] = added_p99;
  j["request_cpu_us"] = request_cpu_us;
  j["tokenize_us"] = tokenize_us;
  j["request_cpu_ratio_to_goal"] = request_cpu_us / request_goal_us;
  j["per_token_us"] = per_token_us;
  j["per_token_floor_us"] = floor_us;
  j["streams_held"] = ok.load();
  j["concurrent_per_token_us"] = concurrent_per_token_us;
  j["goals_met"] = {{"added_ttft_p50", added_p50 <= 1.0},
                    {"request_cpu", request_cpu_us <= request_goal_us},
                    {"per_token", per_token_us <= 5.0},
                    {"streams", ok.load() == streams}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
