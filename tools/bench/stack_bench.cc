// ferry bench stack [--concurrency N] [--requests N] [--prompt_tokens N] [--output_tokens N]
//                   [--setups aggregated,pd] [--weights native|bf16] [--seed S] [--quick]:
// how close the serving stack comes to its own engine (issue 52's stack_vs_offline_c16).
//
// The same requests (the same prompt token ids and output lengths: a Mooncake-format trace
// written here, read by ferry-load and by this program with tools/load/workload.h, so the ids are
// equal by construction) go, closed loop with N in flight (16; each user sends its next request
// when its previous one ends), to
//   1. the stack: ferry-router over one aggregated ferry-worker with every core (`./ferry up
//      --aggregated`'s split), then over a prefill and a decode worker with half the cores each
//      (`./ferry up`'s default shape, UCX), driven by ferry-load (streaming completions with
//      ignore_eos, greedy), the flags of deploy/local/stack less the KV store (every prompt is
//      new, so the store only writes) and the admin planner;
//   2. the engine alone, in this process: WorkerEngine (what the worker serves, built from the
//      same options: weights, threads, KV pool, scheduler) with Engine::Submit and its events,
//      no RPC, no HTTP, no tokenizer.
// Throughput over the steady window, measured alike on both: from the first request's end (every
// user has sent by then and the batch is full) to the last request's send (after it the loop
// drains), output tokens whose time falls inside (each request's tokens spread evenly from its
// first token to its end) over the window's length. Ratio = stack / engine (goal >= 0.9 for the
// aggregated stack; P/D's reported beside it). Also per run: TTFT and ITL p50, the CPU seconds of
// the workers, the router and ferry-load per output token, and the share of the CPUs other
// processes took (a busy neighbour slows one run and not the other).
//
// A table, then one JSON line {"bench":"stack","stack_vs_offline_c16",...}. Exit 1 when a run
// could not be made (a service that does not start, failed requests); every process started is
// killed at the end, and when this one dies (PR_SET_PDEATHSIG). Needs FERRY_MODEL_GGUF. The
// binaries come as arguments (the BUILD target's $(location)s).

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "services/worker/worker_engine.h"
#include "services/worker/worker_options.h"
#include "tests/integration/service_process.h"
#include "tools/bench/bench_process.h"
#include "tools/load/load_report.h"
#include "tools/load/workload.h"

namespace ferry {
namespace {

using bench::Clock;
using bench::CommandResult;
using bench::Cores;
using bench::MachineCpu;
using bench::ProcessCpuSeconds;
using bench::ReadMachineCpu;
using bench::Since;
using bench::Tail;

std::string g_dir;  // the run's temporary directory (logs, trace, records), removed at exit

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "stack_bench: %s\n", what.c_str());
  if (!g_dir.empty()) std::fprintf(stderr, "stack_bench: logs kept in %s\n", g_dir.c_str());
  std::exit(1);  // the services die with this process (PR_SET_PDEATHSIG)
}

struct Options {
  int concurrency = 16;
  int requests = 0;  // 0: 10 x concurrency
  int prompt_tokens = 256;
  int output_tokens = 64;
  std::vector<std::string> setups = {"aggregated", "pd"};
  std::string weights = "native";  // `./ferry up`'s
  uint64_t seed = 52;
  std::string router, worker, load;
};

// --- The workload --------------------------------------------------------------------------------

// `n` requests of `prompt` tokens (each its own 512-token trace blocks: nothing shared) and
// `output` tokens, all at time 0 (the closed loop sends them in order).
void WriteTrace(const std::string& path, int n, int prompt, int output) {
  std::ofstream out(path);
  const int blocks = (prompt + 511) / 512;
  for (int i = 0; i < n; ++i) {
    std::vector<uint64_t> ids;
    for (int b = 0; b < blocks; ++b) ids.push_back(1000 + static_cast<uint64_t>(i) * 64 + b);
    out << nlohmann::json({{"timestamp", 0},
                           {"input_length", prompt},
                           {"output_length", output},
                           {"hash_ids", ids}})
               .dump()
        << "\n";
  }
  if (!out) Fail("cannot write " + path);
}

// The workload as ferry-load builds it from the flags RunStack passes it.
Workload LoadWorkload(const std::string& trace, const Options& o) {
  WorkloadOptions w;
  w.kind = "trace";
  w.seed = o.seed;
  w.trace.path = trace;
  w.trace.block_tokens = 512;
  w.trace.seed = o.seed;
  absl::StatusOr<Workload> workload = MakeWorkload(w, /*open_loop=*/false);
  if (!workload.ok()) Fail("the workload: " + workload.status().ToString());
  return *std::move(workload);
}

// --- The steady window ---------------------------------------------------------------------------

struct Throughput {
  double tokens_per_s = 0;
  double window_s = 0;
  double all_tokens_per_s = 0;  // every output token over first send to last end
  double ttft_p50_ms = 0, itl_p50_ms = 0;
  int64_t output_tokens = 0;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Throughput SteadyWindow(const std::vector<RequestRecord>& records) {
  Throughput t;
  double first_end = 1e300, last_send = 0, last_end = 0;
  std::vector<double> ttfts, itls;
  for (const RequestRecord& r : records) {
    first_end = std::min(first_end, r.start_s + r.e2e_s);
    last_send = std::max(last_send, r.start_s);
    last_end = std::max(last_end, r.start_s + r.e2e_s);
    t.output_tokens += r.output_tokens;
    ttfts.push_back(r.ttft_s * 1e3);
    if (r.output_tokens > 1) itls.push_back((r.e2e_s - r.ttft_s) / (r.output_tokens - 1) * 1e3);
  }
  t.ttft_p50_ms = Median(ttfts);
  t.itl_p50_ms = Median(itls);
  if (last_end > 0) t.all_tokens_per_s = static_cast<double>(t.output_tokens) / last_end;
  if (last_send <= first_end) return t;  // too few requests for a window
  double inside = 0;
  for (const RequestRecord& r : records) {
    const int64_t n = r.output_tokens;
    const double first = r.start_s + r.ttft_s, end = r.start_s + r.e2e_s;
    for (int64_t k = 0; k < n; ++k) {
      const double at = n == 1 ? end : first + (end - first) * static_cast<double>(k) / (n - 1);
      if (at >= first_end && at <= last_send) inside += 1;
    }
  }
  t.window_s = last_send - first_end;
  t.tokens_per_s = inside / t.window_s;
  return t;
}

// --- The stack -----------------------------------------------------------------------------------

struct RunResult {
  std::string name;
  Throughput throughput;
  double workers_cpu_s = 0, router_cpu_s = 0, load_cpu_s = 0;
  double others_share = 0;
  double wall_s = 0;
};

std::unique_ptr<ServiceProcess> Start(const std::string& binary,
                                      const std::vector<std::string>& args,
                                      const std::string& what) {
  auto p = std::make_unique<ServiceProcess>(binary, args, absl::Seconds(120));
  if (!p->ready()) Fail(absl::StrCat(what, " did not start:\n", p->LogTail()));
  return p;
}

std::vector<RequestRecord> ReadRecords(const std::string& path) {
  std::vector<RequestRecord> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    RequestRecord r;
    r.id = j.value("id", int64_t{-1});
    r.ok = j.value("ok", false);
    r.start_s = j.value("start_s", 0.0);
    r.ttft_s = j.value("ttft_s", 0.0);
    r.e2e_s = j.value("e2e_s", 0.0);
    r.output_tokens = j.value("output_tokens", int64_t{0});
    records.push_back(r);
  }
  return records;
}

RunResult RunStack(const Options& o, const std::string& setup, const std::string& trace,
                   const std::string& model, int requests) {
  const auto wall_start = Clock::now();
  const int cores = Cores();
  std::vector<std::unique_ptr<ServiceProcess>> workers;
  auto worker_args = [&](int threads, std::vector<std::string> extra) {
    std::vector<std::string> a = {"--model=" + model, absl::StrCat("--threads=", threads),
                                  "--weights=" + o.weights, "--drain_grace=1s", "--rpc_grace=1s"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  if (setup == "pd") {
    const int threads = std::max(1, cores / 2);
    workers.push_back(Start(o.worker,
                            worker_args(threads, {"--role=decode", "--kv_pool_bytes=1GiB"}),
                            "the decode worker"));
    workers.push_back(Start(o.worker,
                            worker_args(threads, {"--role=prefill", "--kv_pool_bytes=512MiB"}),
                            "the prefill worker"));
  } else {
    workers.push_back(Start(o.worker,
                            worker_args(cores, {"--role=aggregated", "--kv_pool_bytes=1GiB"}),
                            "the aggregated worker"));
  }
  std::vector<std::string> addresses;
  for (const auto& w : workers) addresses.push_back(w->address());
  auto router = Start(o.router,
                      {"--model=" + model, "--served_model_name=smol",
                       "--workers=" + absl::StrJoin(addresses, ",")},
                      "the router");
  const auto start = Clock::now();
  while (true) {  // until the router's registry has every worker up
    std::string body;
    if (HttpGet(router->admin_port(), "/workers", &body) == 200) {
      const auto j = nlohmann::json::parse(body, nullptr, false);
      size_t up = 0;
      if (j.is_array()) {
        for (const auto& w : j) up += w.value("state", "") == "up" ? 1 : 0;
      }
      if (up == workers.size()) break;
    }
    if (Since(start) > 60) Fail("the router did not see its workers up:\n" + router->LogTail());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string url = absl::StrCat("http://127.0.0.1:", router->grpc_port());
  // Warm-up: a few requests of another seed (nothing shared with the measured ones).
  const CommandResult warm =
      bench::RunCommand(o.load,
                        {"--url=" + url, "--model=smol", "--mode=closed", "--concurrency=4",
                         "--workload=trace", "--trace=" + trace, "--block_tokens=512", "--limit=8",
                         absl::StrCat("--seed=", o.seed + 1), "--progress=false"},
                        300, g_dir, "warmup");
  if (warm.exit_code != 0)
    Fail("the warm-up load failed:\n" + warm.err_tail + Tail(warm.out, 2000));

  std::vector<pid_t> pids;
  for (const auto& w : workers) pids.push_back(w->pid());
  auto workers_cpu = [&] {
    double s = 0;
    for (pid_t p : pids) s += ProcessCpuSeconds(p);
    return s;
  };
  const double workers0 = workers_cpu(), router0 = ProcessCpuSeconds(router->pid());
  const MachineCpu machine0 = ReadMachineCpu();
  const auto load_start = Clock::now();
  const std::string records = absl::StrCat(g_dir, "/records-", setup, ".jsonl");
  const CommandResult load = bench::RunCommand(
      o.load,
      {"--url=" + url, "--model=smol", "--mode=closed",
       absl::StrCat("--concurrency=", o.concurrency), "--workload=trace", "--trace=" + trace,
       "--block_tokens=512", absl::StrCat("--limit=", requests), absl::StrCat("--seed=", o.seed),
       "--request_timeout=5m", "--progress=false", "--records_out=" + records},
      1800, g_dir, "load-" + setup);
  const double load_wall = Since(load_start);
  const MachineCpu machine1 = ReadMachineCpu();
  RunResult r;
  r.name = setup;
  r.workers_cpu_s = workers_cpu() - workers0;
  r.router_cpu_s = ProcessCpuSeconds(router->pid()) - router0;
  r.load_cpu_s = load.cpu_seconds;
  const double mine = r.workers_cpu_s + r.router_cpu_s + r.load_cpu_s;
  r.others_share =
      std::clamp((machine1.busy - machine0.busy - mine) / (load_wall * cores), 0.0, 1.0);
  for (const auto& w : workers) {
    if (!w->running()) Fail("a worker died during the run:\n" + w->LogTail());
  }
  router.reset();
  workers.clear();
  if (load.exit_code != 0) {
    Fail(absl::StrCat("ferry-load failed (exit ", load.exit_code, "):\n", load.err_tail, "\n",
                      Tail(load.out, 2000)));
  }
  const std::vector<RequestRecord> got = ReadRecords(records);
  int ok = 0;
  for (const RequestRecord& rec : got) ok += rec.ok && rec.output_tokens == o.output_tokens;
  if (static_cast<int>(got.size()) != requests || ok != requests) {
    Fail(absl::StrCat("ferry-load: ", ok, " of ", got.size(), " requests complete with ",
                      o.output_tokens, " tokens (", requests, " sent):\n", Tail(load.out, 2000)));
  }
  r.throughput = SteadyWindow(got);
  r.wall_s = Since(wall_start);
  return r;
}

// --- The engine alone ----------------------------------------------------------------------------

RunResult RunOffline(const Options& o, const std::string& model, const Workload& workload,
                     int requests) {
  const auto wall_start = Clock::now();
  WorkerOptions wo;
  wo.model = model;
  wo.weights = o.weights;
  wo.threads = Cores();
  wo.kv_pool_bytes = int64_t{1} << 30;
  absl::StatusOr<std::unique_ptr<WorkerEngine>> created = WorkerEngine::Create(wo, nullptr);
  if (!created.ok()) Fail("the engine: " + created.status().ToString());
  Engine& engine = (*created)->engine();

  absl::Mutex mu;
  std::vector<RequestRecord> records(static_cast<size_t>(requests));
  int finished = 0, failed = 0;
  std::string first_error;
  Clock::time_point t0;
  auto submit = [&](int i, bool warmup) {
    const LoadRequest& lr = workload.requests[static_cast<size_t>(i)];
    EngineRequest er;
    er.id = absl::StrCat(warmup ? "warm-" : "req-", i);
    er.prompt = lr.prompt;
    er.max_tokens = lr.max_tokens;
    er.ignore_eos = true;
    er.sampling.temperature = 0;
    RequestRecord* rec = warmup ? nullptr : &records[static_cast<size_t>(i)];
    const double sent = Since(t0);
    if (rec != nullptr) {
      rec->id = i;
      rec->start_s = sent;
    }
    er.on_event = [&, rec, sent](const TokenEvent& e) {
      absl::MutexLock lock(&mu);
      const double now = Since(t0);
      if (rec != nullptr && e.has_token) {
        if (rec->output_tokens == 0) rec->ttft_s = now - sent;
        ++rec->output_tokens;
      }
      if (e.finish == FinishReason::kNone) return;
      if (rec != nullptr) {
        rec->e2e_s = now - sent;
        rec->ok = e.finish == FinishReason::kLength;
        if (!rec->ok) {
          ++failed;
          if (first_error.empty()) first_error = e.error;
        }
      }
      ++finished;
    };
    const absl::Status s = engine.Submit(std::move(er));
    if (!s.ok()) Fail("Submit: " + s.ToString());
  };
  // Warm-up as the stack's: 8 requests, 4 at once (the model's scratch grows).
  t0 = Clock::now();
  for (int i = 0; i < 8; ++i) submit(i, /*warmup=*/true);
  {
    absl::MutexLock lock(&mu);
    auto warm = [&finished] { return finished >= 8; };
    mu.Await(absl::Condition(&warm));
    finished = 0;
  }
  const double cpu0 = ProcessCpuSeconds(getpid());
  const MachineCpu machine0 = ReadMachineCpu();
  t0 = Clock::now();
  int sent = 0;
  {
    absl::MutexLock lock(&mu);
    while (sent < requests) {
      // Closed loop: `concurrency` users, each sending its next request when one ends.
      while (sent < requests && sent - finished < o.concurrency) {
        mu.Unlock();
        submit(sent, /*warmup=*/false);
        mu.Lock();
        ++sent;
      }
      const int target = finished + 1;
      auto advanced = [&finished, target] { return finished >= target; };
      if (sent < requests) mu.Await(absl::Condition(&advanced));
    }
    auto all_done = [&finished, requests] { return finished >= requests; };
    mu.Await(absl::Condition(&all_done));
  }
  const double wall = Since(t0);
  RunResult r;
  r.name = "engine";
  r.workers_cpu_s = ProcessCpuSeconds(getpid()) - cpu0;
  const MachineCpu machine1 = ReadMachineCpu();
  r.others_share =
      std::clamp((machine1.busy - machine0.busy - r.workers_cpu_s) / (wall * Cores()), 0.0, 1.0);
  if (failed > 0) Fail(absl::StrCat(failed, " requests failed in the engine: ", first_error));
  r.throughput = SteadyWindow(records);
  r.wall_s = Since(wall_start);
  return r;
}

// --- Report --------------------------------------------------------------------------------------

void PrintRow(const RunResult& r) {
  const double tokens = static_cast<double>(r.throughput.output_tokens);
  std::printf("  %-11s %8.1f %10.1f %8.1f %9.1f %9.1f %10.2f %9.2f %8.2f %7.0f%%\n", r.name.c_str(),
              r.throughput.tokens_per_s, r.throughput.all_tokens_per_s, r.throughput.window_s,
              r.throughput.ttft_p50_ms, r.throughput.itl_p50_ms,
              tokens > 0 ? r.workers_cpu_s / tokens * 1e3 : 0,
              tokens > 0 ? r.router_cpu_s / tokens * 1e3 : 0,
              tokens > 0 ? r.load_cpu_s / tokens * 1e3 : 0, r.others_share * 100);
}

int Main(int argc, char** argv) {
  Options o;
  std::vector<std::string> positional;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const std::string& name) -> std::string {
      if (i + 1 >= argc) Fail(name + " needs a value");
      return argv[++i];
    };
    auto integer = [&](const std::string& name) {
      int v = 0;
      if (!absl::SimpleAtoi(value(name), &v) || v <= 0) Fail(name + " needs a positive integer");
      return v;
    };
    if (a == "--concurrency") {
      o.concurrency = integer(a);
    } else if (a == "--requests") {
      o.requests = integer(a);
    } else if (a == "--prompt_tokens") {
      o.prompt_tokens = integer(a);
    } else if (a == "--output_tokens") {
      o.output_tokens = integer(a);
    } else if (a == "--setups") {
      o.setups = absl::StrSplit(value(a), ',', absl::SkipEmpty());
    } else if (a == "--weights") {
      o.weights = value(a);
    } else if (a == "--seed") {
      o.seed = static_cast<uint64_t>(integer(a));
    } else if (a == "--quick") {
      quick = true;
    } else if (absl::StartsWith(a, "--")) {
      Fail("unknown flag " + a +
           " (--concurrency --requests --prompt_tokens --output_tokens --setups --weights --seed "
           "--quick)");
    } else {
      positional.push_back(a);
    }
  }
  if (positional.size() != 3) Fail("usage: stack_bench ROUTER WORKER LOAD [flags]");
  o.router = positional[0];
  o.worker = positional[1];
  o.load = positional[2];
  for (const std::string& s : o.setups) {
    if (s != "aggregated" && s != "pd") Fail("--setups: aggregated and/or pd, not " + s);
  }
  const int requests = o.requests > 0 ? o.requests : (quick ? 4 : 10) * o.concurrency;
  const char* gguf = std::getenv("FERRY_MODEL_GGUF");
  if (gguf == nullptr || *gguf == '\0') Fail("FERRY_MODEL_GGUF is not set");
  const std::string model = gguf;

  char dir_template[] = "/tmp/ferry-stack-bench.XXXXXX";
  if (mkdtemp(dir_template) == nullptr) Fail("mkdtemp failed");
  g_dir = dir_template;
  setenv("TEST_TMPDIR", g_dir.c_str(), 1);  // ServiceProcess's logs
  const std::string trace = g_dir + "/trace.jsonl";
  WriteTrace(trace, requests, o.prompt_tokens, o.output_tokens);
  const Workload workload = LoadWorkload(trace, o);

  std::fprintf(stderr,
               "stack: %d requests of %d prompt + %d output tokens, closed loop of %d, %s "
               "weights, %d cores\n",
               requests, o.prompt_tokens, o.output_tokens, o.concurrency, o.weights.c_str(),
               Cores());
  std::vector<RunResult> stacks;
  for (const std::string& setup : o.setups) {
    std::fprintf(stderr, "stack: the %s stack...\n", setup.c_str());
    stacks.push_back(RunStack(o, setup, trace, model, requests));
  }
  std::fprintf(stderr, "stack: the engine alone, in process...\n");
  const RunResult offline = RunOffline(o, model, workload, requests);

  std::printf(
      "stack vs the engine alone: %d requests of %d + %d tokens, closed loop of %d, %s weights\n",
      requests, o.prompt_tokens, o.output_tokens, o.concurrency, o.weights.c_str());
  std::printf("  %-11s %8s %10s %8s %9s %9s %10s %9s %8s %8s\n", "run", "tok/s", "tok/s(all)",
              "window", "TTFT p50", "ITL p50", "workers", "router", "load", "others");
  std::printf("  %-11s %8s %10s %8s %9s %9s %10s %9s %8s %8s\n", "", "steady", "", "s", "ms", "ms",
              "ms CPU/tok", "ms/tok", "ms/tok", "CPUs");
  for (const RunResult& r : stacks) PrintRow(r);
  PrintRow(offline);
  nlohmann::ordered_json j;
  j["bench"] = "stack";
  j["concurrency"] = o.concurrency;
  j["requests"] = requests;
  j["weights"] = o.weights;
  j["offline_tok_s"] = offline.throughput.tokens_per_s;
  for (const RunResult& r : stacks) {
    const double ratio = offline.throughput.tokens_per_s > 0
                             ? r.throughput.tokens_per_s / offline.throughput.tokens_per_s
                             : 0;
    std::printf("  %s stack / engine alone: %.3f (goal >= 0.9 for aggregated)\n", r.name.c_str(),
                ratio);
    j[r.name + "_tok_s"] = r.throughput.tokens_per_s;
    j[r.name + "_vs_offline"] = ratio;
    j[r.name + "_workers_cpu_ms_per_token"] =
        r.workers_cpu_s / std::max<double>(1, r.throughput.output_tokens) * 1e3;
    j[r.name + "_router_cpu_ms_per_token"] =
        r.router_cpu_s / std::max<double>(1, r.throughput.output_tokens) * 1e3;
    j[r.name + "_others_share"] = r.others_share;
    if (r.name == "aggregated") {
      j[absl::StrCat("stack_vs_offline_c", o.concurrency)] = ratio;
      j["goal_met"] = ratio >= 0.9;
    }
  }
  std::printf("%s\n", j.dump().c_str());
  std::filesystem::remove_all(g_dir);
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
