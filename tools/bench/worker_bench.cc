// ferry bench worker [--requests N] [--prompt N] [--tokens N]: what serving the engine over gRPC
// costs. The same workload (C concurrent callers, each running requests of a P-token prompt and T
// output tokens one after the other) runs twice in this process:
//   baseline: the engine itself (NullModel at zero cost behind the real scheduler, prefix cache
//             and events), callers submitting directly and waiting on their events;
//   service:  a Worker (ferry-worker's library: the gRPC server, Generate calls, the Watch hub,
//             metrics) on loopback with the same null engine, callers on their own channels.
// With a model that costs nothing, what is left is the serving path: tokens/s of the service over
// tokens/s of the engine is the fraction of a token's cost the worker adds on top. Per caller
// count it prints requests/s, tokens/s, the ratio, and p50/p99 of the service's time to first
// token and per-request time; then one JSON line. The null engine needs only the model's
// tokenizer (FERRY_MODEL_GGUF, set by ./ferry bench).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/common/mutex_mode.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "services/worker/worker.h"
#include "tools/worker_cli/worker_client.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

struct Workload {
  int callers = 1;
  int requests = 0;  // per caller
  int prompt = 256;
  int tokens = 64;
};

struct Result {
  double seconds = 0;
  int64_t requests = 0, tokens = 0;
  std::vector<double> ttft, total;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

std::vector<TokenId> PromptFor(int caller, int request, int length, int64_t vocab) {
  std::vector<TokenId> p(length);
  uint64_t x = static_cast<uint64_t>(caller) * 1000003 + static_cast<uint64_t>(request) + 1;
  for (TokenId& t : p) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<TokenId>(10 + (x >> 33) % static_cast<uint64_t>(vocab - 10));
  }
  return p;
}

Result RunEngine(Engine& engine, const Workload& w, int64_t vocab) {
  Result r;
  absl::Mutex mu;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < w.callers; ++c) {
    threads.emplace_back([&, c] {
      for (int i = 0; i < w.requests; ++i) {
        absl::Notification finished;
        int64_t tokens = 0;  // the engine thread's until finished
        EngineRequest q;
        q.id = absl::StrCat("e", c, "-", i);
        q.prompt = PromptFor(c, i, w.prompt, vocab);
        q.max_tokens = w.tokens;
        q.sampling.temperature = 0;
        q.on_event = [&](const TokenEvent& e) {
          if (e.has_token) ++tokens;
          if (e.finish != FinishReason::kNone) finished.Notify();
        };
        if (!engine.Submit(std::move(q)).ok()) std::abort();
        finished.WaitForNotification();
        absl::MutexLock stats(&mu);
        ++r.requests;
        r.tokens += tokens;
      }
    });
  }
  for (auto& t : threads) t.join();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

Result RunService(const std::string& address, const Workload& w, int64_t vocab) {
  Result r;
  absl::Mutex mu;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < w.callers; ++c) {
    threads.emplace_back([&, c] {
      WorkerClient client(address);
      for (int i = 0; i < w.requests; ++i) {
        v1::GenerateRequest request;
        request.set_aggregated(true);
        v1::TokenizedRequest* t = request.mutable_request();
        t->mutable_context()->set_request_id(absl::StrCat("s", c, "-", i));
        for (TokenId id : PromptFor(c, i, w.prompt, vocab)) t->add_prompt_token_ids(id);
        t->mutable_sampling()->set_temperature(0);
        t->mutable_sampling()->set_max_tokens(static_cast<uint32_t>(w.tokens));
        const auto sent = Clock::now();
        double ttft = -1;
        GenerateResult got =
            client.Generate(request, absl::Seconds(600), [&](const v1::GenerateEvent& e) {
              if (ttft < 0 && e.has_tokens() && e.tokens().token_ids_size() > 0) {
                ttft = std::chrono::duration<double>(Clock::now() - sent).count();
              }
              return true;
            });
        const double total = std::chrono::duration<double>(Clock::now() - sent).count();
        if (!got.status.ok()) {
          std::fprintf(stderr, "worker_bench: %s\n", got.status.error_message().c_str());
          std::exit(1);
        }
        absl::MutexLock stats(&mu);
        ++r.requests;
        r.tokens += static_cast<int64_t>(got.choices[0].tokens.size());
        r.ttft.push_back(ttft);
        r.total.push_back(total);
      }
    });
  }
  for (auto& t : threads) t.join();
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return r;
}

int Main(int argc, char** argv) {
  UseProgramMutexMode();
  int requests = 0, prompt = 256, tokens = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--requests") {
      requests = std::atoi(argv[i + 1]);
    } else if (flag == "--prompt") {
      prompt = std::atoi(argv[i + 1]);
    } else if (flag == "--tokens") {
      tokens = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "usage: worker_bench [--requests N] [--prompt N] [--tokens N]\n");
      return 2;
    }
  }
  const char* model = std::getenv("FERRY_MODEL_GGUF");
  if (model == nullptr) {
    std::fprintf(stderr, "worker_bench: FERRY_MODEL_GGUF is not set; run ./ferry bench worker\n");
    return 2;
  }
  // The baseline engine: the null model of the same tokenizer and positions, as the worker
  // builds it (WorkerEngine), with the worker's scheduler settings.
  WorkerOptions options;
  options.engine = "null";
  options.model = model;
  options.null_prefill_tokens_per_second = 0;
  options.null_token_seconds = 0;
  options.kv_pool_bytes = int64_t{256} << 20;
  options.max_running = 64;
  options.max_queued = 1024;
  auto baseline = WorkerEngine::Create(options, {});
  if (!baseline.ok()) {
    std::fprintf(stderr, "worker_bench: %s\n", std::string(baseline.status().message()).c_str());
    return 1;
  }
  const int64_t vocab = (*baseline)->model().config().vocab_size;
  auto worker = Worker::Start(options);
  if (!worker.ok()) {
    std::fprintf(stderr, "worker_bench: %s\n", std::string(worker.status().message()).c_str());
    return 1;
  }
  std::printf("ferry bench worker: null engine (zero cost), %d-token prompts, %d output tokens\n",
              prompt, tokens);
  std::printf("%8s %10s %12s %12s %12s %8s %10s %10s %10s\n", "callers", "requests", "engine t/s",
              "service t/s", "service r/s", "ratio", "ttft p50", "ttft p99", "req p99");
  nlohmann::json rows = nlohmann::json::array();
  for (int callers : {1, 16, 64}) {
    Workload w;
    w.callers = callers;
    w.requests = requests > 0 ? requests : std::max(4, 256 / callers);
    w.prompt = prompt;
    w.tokens = tokens;
    const Result e = RunEngine((*baseline)->engine(), w, vocab);
    const Result s = RunService((*worker)->address(), w, vocab);
    const double engine_tps = static_cast<double>(e.tokens) / e.seconds;
    const double service_tps = static_cast<double>(s.tokens) / s.seconds;
    std::printf("%8d %10lld %12.0f %12.0f %12.1f %8.2f %9.2fms %9.2fms %9.2fms\n", callers,
                static_cast<long long>(s.requests), engine_tps, service_tps,
                static_cast<double>(s.requests) / s.seconds, service_tps / engine_tps,
                1e3 * Percentile(s.ttft, 0.5), 1e3 * Percentile(s.ttft, 0.99),
                1e3 * Percentile(s.total, 0.99));
    rows.push_back({{"callers", callers},
                    {"requests", s.requests},
                    {"engine_tokens_per_second", engine_tps},
                    {"service_tokens_per_second", service_tps},
                    {"service_requests_per_second", static_cast<double>(s.requests) / s.seconds},
                    {"ratio", service_tps / engine_tps},
                    {"ttft_p50_ms", 1e3 * Percentile(s.ttft, 0.5)},
                    {"ttft_p99_ms", 1e3 * Percentile(s.ttft, 0.99)},
                    {"request_p99_ms", 1e3 * Percentile(s.total, 0.99)}});
  }
  (*worker)->Shutdown();
  nlohmann::json out = {{"benchmark", "worker"},
                        {"prompt_tokens", prompt},
                        {"output_tokens", tokens},
                        {"rows", rows}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
