// ferry bench simfidelity [--requests N] [--rates A,B] [--setups pd,aggregated] [--quick]
//                         [--calibration_pd FILE] [--calibration_aggregated FILE]
//                         [--calibrate_bin PATH]:
// how well the simulated engine (`--engine=sim`, engine/model/sim_timing.h) predicts the real CPU
// stack on a workload it was not fitted to (issue 26).
//
// 1. Calibrate on one workload: ferry-calibrate --quick (tools/calibrate: its own designed step
//    shapes, one request shape at a time, on an otherwise idle stack) with the compute threads
//    each worker of the set-up runs: 1 for the prefill/decode pair (one core each on this
//    2-core machine; the KV link measured over UCX tcp, as the pair uses), the machine's cores
//    for the one aggregated worker (`./ferry up`'s split: cores / engines). No KV store.
// 2. The test workload, another one: a Mooncake-format trace written here (fixed seed) that
//    ferry-load replays open loop: prompts of 300-1,200 tokens (most of the calibration's prefill
//    shapes are 16-512 tokens in one row; here the worker's scheduler chunks them), about 40% of
//    them opening with one of 3 shared 512-token prefixes (prefix-cache hits after the first),
//    16-32 output tokens (ignore_eos), Poisson arrivals at a light and a moderate rate (the same
//    requests and arrival sequence, time-scaled).
// 3. Real runs: ferry-router over ferry-prefill + ferry-decode (UCX tcp), then over one
//    ferry-worker, on SmolLM2 (FERRY_MODEL_GGUF, bf16 weights as the worker's default), the
//    flags of deploy/local/stack less the KV store; the workload twice per set-up and rate, each
//    run on a freshly started stack (cold caches, the same requests and arrival times), a short
//    warm-up first. The run-to-run spread is |run1 - run2| / their mean.
// 4. Simulated runs: the same stacks, the same router and flags, workers with --engine=sim
//    --sim_calibration=<the file fitted in 1>; the workload once, between the two real runs (so
//    that drift of the machine shows in the spread rather than in the error).
// 5. Per set-up and rate: TTFT and e2e means (ferry-load's, over ok requests), real run 1, run 2,
//    sim, error = |sim - mean(real)| / mean(real), spread. Goal (the issue's): error <= max(10%,
//    2 x spread) for each metric of each row. Also per run: cached prompt tokens (the sim runs the
//    real scheduler, prefix cache and router, so they must match), the CPU time of the workers,
//    the router and the load tool, and the share of the CPUs other processes took meanwhile (this
//    machine is shared: a busy neighbour slows the real stack, never the simulated one).
//
// A table for people, then one JSON line {"bench":"simfidelity","ttft_error","e2e_error","spread",
// "goal_met",...}. Exit 1 when something could not run (a binary missing, a service that does
// not start, failed requests); every process started here is killed at the end, and also when
// this one dies (PR_SET_PDEATHSIG). Needs FERRY_MODEL_GGUF.
//
// The binaries come as arguments (the BUILD target's $(location)s); --calibrate_bin overrides
// ferry-calibrate's.

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "tests/integration/service_process.h"
#include "tools/bench/bench_process.h"

namespace ferry {
namespace {

using bench::Clock;
using bench::CommandResult;
using bench::Cores;
using bench::MachineCpu;
using bench::ProcessCpuSeconds;
using bench::ReadFile;
using bench::ReadMachineCpu;
using bench::Since;
using bench::Tail;

std::string g_dir;  // the run's temporary directory (logs, trace, calibrations), removed at exit

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "simfidelity_bench: %s\n", what.c_str());
  if (!g_dir.empty()) std::fprintf(stderr, "simfidelity_bench: logs kept in %s\n", g_dir.c_str());
  std::exit(1);  // the services die with this process (PR_SET_PDEATHSIG)
}

// ferry-load and ferry-calibrate, their output under g_dir.
CommandResult RunCommand(const std::string& binary, const std::vector<std::string>& args,
                         double timeout_s, const std::string& name) {
  return bench::RunCommand(binary, args, timeout_s, g_dir, name);
}

// --- The workload --------------------------------------------------------------------------------

struct TraceSummary {
  int requests = 0;
  int shared = 0;  // opening with a shared 512-token prefix
  int64_t prompt_tokens = 0, output_tokens = 0;
  double span_s = 0;  // the last arrival, at rate 1/s
};

// A Mooncake-format trace of `n` requests at 1 request/s (Poisson gaps scaled to a mean of exactly
// 1 s; ferry-load's --time_scale 1/rate gives the rate): prompts of 300-1,200 tokens, 16-32 output
// tokens, prompts over 600 tokens open with one of 3 shared 512-token blocks 2 times in 3 (hash ids
// < 100; the rest of a prompt is its own). Read with --block_tokens 512, every trace block is 512
// real tokens.
TraceSummary WriteTrace(const std::string& path, int n, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
  auto next = [&x]() {  // SplitMix64: the same sequence on every platform
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  auto uniform = [&next]() { return static_cast<double>(next() >> 11) / 9007199254740992.0; };
  // Exponential gaps, scaled so that their mean is exactly 1 s: the rate is the one named.
  std::vector<double> arrival_ms(static_cast<size_t>(n), 0.0);
  for (int i = 1; i < n; ++i) {
    arrival_ms[static_cast<size_t>(i)] =
        arrival_ms[static_cast<size_t>(i - 1)] - std::log(1.0 - uniform()) * 1000.0;
  }
  if (n > 1 && arrival_ms.back() > 0) {
    const double scale = (n - 1) * 1000.0 / arrival_ms.back();
    for (double& t : arrival_ms) t *= scale;
  }
  std::ofstream out(path);
  TraceSummary s;
  for (int i = 0; i < n; ++i) {
    const double t_ms = arrival_ms[static_cast<size_t>(i)];
    const int64_t input = 300 + static_cast<int64_t>(next() % 901);
    const int64_t output = 16 + static_cast<int64_t>(next() % 17);
    const int64_t blocks = (input + 511) / 512;
    const bool shared = input > 600 && next() % 3 != 0;
    std::vector<uint64_t> ids;
    for (int64_t b = 0; b < blocks; ++b) {
      ids.push_back(b == 0 && shared ? 1 + next() % 3 : 1000 + static_cast<uint64_t>(i) * 8 + b);
    }
    nlohmann::json j = {
        {"timestamp", t_ms}, {"input_length", input}, {"output_length", output}, {"hash_ids", ids}};
    out << j.dump() << "\n";
    ++s.requests;
    s.shared += shared ? 1 : 0;
    s.prompt_tokens += input;
    s.output_tokens += output;
    s.span_s = t_ms / 1000.0;
  }
  if (!out) Fail("cannot write " + path);
  return s;
}

// --- The stacks ----------------------------------------------------------------------------------

struct Binaries {
  std::string router, worker, load, calibrate;
};

struct Setup {
  std::string name;         // "pd" or "aggregated"
  std::string label;        // for people
  int threads = 1;          // compute threads of each worker
  std::string calibration;  // the fitted file (sim runs)
  std::string fit_line;     // ferry-calibrate's fit summary
  std::string contention_line;
  double calibration_others = 0;  // the share of the CPUs other processes took meanwhile
};

struct Stack {
  std::vector<std::unique_ptr<ServiceProcess>> workers;
  std::unique_ptr<ServiceProcess> router;
};

std::unique_ptr<ServiceProcess> Start(const std::string& binary,
                                      const std::vector<std::string>& args,
                                      const std::string& what) {
  auto p = std::make_unique<ServiceProcess>(binary, args, absl::Seconds(120));
  if (!p->ready()) Fail(absl::StrCat(what, " did not start:\n", p->LogTail()));
  return p;
}

// The set-up's workers (real or simulated) and a router over them, as deploy/local/stack starts
// them less the KV store; returns once the router sees every worker up.
Stack StartStack(const Binaries& bin, const Setup& setup, bool sim, const std::string& model) {
  std::vector<std::string> engine;
  if (sim) engine = {"--engine=sim", "--sim_calibration=" + setup.calibration};
  auto worker_args = [&](const std::vector<std::string>& role) {
    std::vector<std::string> a = {"--model=" + model, absl::StrCat("--threads=", setup.threads),
                                  "--drain_grace=1s", "--rpc_grace=1s"};
    a.insert(a.end(), role.begin(), role.end());
    a.insert(a.end(), engine.begin(), engine.end());
    return a;
  };
  Stack s;
  const std::string kind = sim ? "sim" : "real";
  if (setup.name == "pd") {
    s.workers.push_back(Start(
        bin.worker,
        worker_args({"--role=decode", "--kv_pool_bytes=1GiB", "--transport=ucx", "--ucx_tls=tcp"}),
        "the " + kind + " decode worker"));
    s.workers.push_back(Start(bin.worker,
                              worker_args({"--role=prefill", "--kv_pool_bytes=512MiB",
                                           "--transport=ucx", "--ucx_tls=tcp"}),
                              "the " + kind + " prefill worker"));
  } else {
    s.workers.push_back(Start(bin.worker,
                              worker_args({"--role=aggregated", "--kv_pool_bytes=1GiB"}),
                              "the " + kind + " aggregated worker"));
  }
  std::vector<std::string> addresses;
  for (const auto& w : s.workers) addresses.push_back(w->address());
  s.router = Start(bin.router,
                   {"--model=" + model, "--served_model_name=smol",
                    "--workers=" + absl::StrJoin(addresses, ","), "--max_queued=1024"},
                   "the router");
  const auto start = Clock::now();
  while (true) {  // until the router's registry has every worker up
    std::string body;
    if (HttpGet(s.router->admin_port(), "/workers", &body) == 200) {
      const auto j = nlohmann::json::parse(body, nullptr, false);
      int up = 0;
      if (j.is_array()) {
        for (const auto& w : j) up += w.value("state", "") == "up" ? 1 : 0;
      }
      if (up == static_cast<int>(s.workers.size())) break;
    }
    if (Since(start) > 60) Fail("the router did not see its workers up:\n" + s.router->LogTail());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return s;
}

// --- One run ------------------------------------------------------------------------------------

// Engine steps of one worker by kind (its /metrics: ferry_worker_step_seconds{kind}): how long
// the steps took, real or modeled, and how many there were.
constexpr const char* kStepKinds[] = {"prefill", "decode", "mixed"};
struct Steps {
  double seconds[3] = {0, 0, 0};
  double count[3] = {0, 0, 0};
  double total_seconds() const { return seconds[0] + seconds[1] + seconds[2]; }
  double total_count() const { return count[0] + count[1] + count[2]; }
};

Steps ReadSteps(const ServiceProcess& worker) {
  Steps s;
  for (int k = 0; k < 3; ++k) {
    const std::string label = absl::StrCat("{kind=\"", kStepKinds[k], "\"}");
    s.seconds[k] =
        std::max(0.0, MetricValue(worker.admin_port(), "ferry_worker_step_seconds_sum" + label));
    s.count[k] =
        std::max(0.0, MetricValue(worker.admin_port(), "ferry_worker_step_seconds_count" + label));
  }
  return s;
}

Steps Minus(const Steps& a, const Steps& b) {
  Steps d;
  for (int k = 0; k < 3; ++k) {
    d.seconds[k] = a.seconds[k] - b.seconds[k];
    d.count[k] = a.count[k] - b.count[k];
  }
  return d;
}

struct RunResult {
  double ttft_ms = 0, e2e_ms = 0;  // means over the ok requests
  double ttft_p50_ms = 0, e2e_p50_ms = 0;
  int64_t requests = 0, ok = 0, prompt_tokens = 0, cached_tokens = 0;
  double duration_s = 0;  // the workload's first send to last end
  double wall_s = 0;      // the whole run, the stack's start and warm-up included
  double workers_cpu_s = 0, router_cpu_s = 0, load_cpu_s = 0;
  double others_share = 0;  // of all CPUs' time during the workload, taken by other processes
  double steal_share = 0;
  std::vector<double> ttft_each_s;  // by request id
  std::vector<Steps> steps;         // per worker (pd: decode, prefill), during the workload
};

RunResult Run(const Binaries& bin, const Setup& setup, bool sim, double rate, int requests,
              const std::string& trace, const std::string& model) {
  const auto wall_start = Clock::now();
  Stack stack = StartStack(bin, setup, sim, model);
  const std::string url = absl::StrCat("http://127.0.0.1:", stack.router->grpc_port());
  // Warm-up: two short requests, one after the other (the model's scratch grows, connections
  // open); their ids are not the trace's, so they share nothing with it.
  const CommandResult warm = RunCommand(
      bin.load,
      {"--url=" + url, "--model=smol", "--mode=closed", "--concurrency=1",
       "--workload=shared_prefix", "--groups=1", "--prompts_per_group=2", "--system_tokens=256",
       "--question_tokens=64", "--output_tokens=4", "--seed=777", "--progress=false"},
      120, "warmup");
  if (warm.exit_code != 0) {
    Fail(absl::StrCat("the warm-up load failed (exit ", warm.exit_code, "):\n", warm.err_tail, "\n",
                      Tail(warm.out, 2000)));
  }

  std::vector<pid_t> worker_pids;
  for (const auto& w : stack.workers) worker_pids.push_back(w->pid());
  auto workers_cpu = [&] {
    double s = 0;
    for (pid_t p : worker_pids) s += ProcessCpuSeconds(p);
    return s;
  };
  std::vector<Steps> steps0;
  for (const auto& w : stack.workers) steps0.push_back(ReadSteps(*w));
  const double workers0 = workers_cpu(), router0 = ProcessCpuSeconds(stack.router->pid());
  const MachineCpu machine0 = ReadMachineCpu();
  const auto load_start = Clock::now();
  static int run_counter = 0;
  const std::string records = absl::StrCat(g_dir, "/records-", ++run_counter, "-", setup.name, "-",
                                           sim ? "sim" : "real", ".jsonl");
  const CommandResult load =
      RunCommand(bin.load,
                 {"--url=" + url, "--model=smol", "--mode=open", "--workload=trace",
                  "--trace=" + trace, "--block_tokens=512",
                  absl::StrCat("--time_scale=", 1.0 / rate), absl::StrCat("--limit=", requests),
                  "--request_timeout=5m", "--progress=false", "--records_out=" + records},
                 900, "load");
  const double load_wall = Since(load_start);
  const MachineCpu machine1 = ReadMachineCpu();
  RunResult r;
  r.workers_cpu_s = workers_cpu() - workers0;
  r.router_cpu_s = ProcessCpuSeconds(stack.router->pid()) - router0;
  r.load_cpu_s = load.cpu_seconds;
  const double mine = r.workers_cpu_s + r.router_cpu_s + r.load_cpu_s;
  const double capacity = load_wall * Cores();
  r.others_share = std::clamp((machine1.busy - machine0.busy - mine) / capacity, 0.0, 1.0);
  r.steal_share = std::clamp((machine1.steal - machine0.steal) / capacity, 0.0, 1.0);
  for (size_t i = 0; i < stack.workers.size(); ++i) {
    if (!stack.workers[i]->running()) {
      Fail("a worker died during the run:\n" + stack.workers[i]->LogTail());
    }
    r.steps.push_back(Minus(ReadSteps(*stack.workers[i]), steps0[i]));
  }
  stack = Stack();  // every process of the stack killed
  if (load.exit_code != 0) {
    Fail(absl::StrCat("ferry-load failed (exit ", load.exit_code,
                      load.timed_out ? ", timed out" : "", "):\n", load.err_tail, "\n",
                      Tail(load.out, 2000)));
  }
  // The report's last line is its JSON.
  std::vector<std::string> lines = absl::StrSplit(load.out, '\n', absl::SkipWhitespace());
  const auto j =
      lines.empty() ? nlohmann::json() : nlohmann::json::parse(lines.back(), nullptr, false);
  if (!j.is_object() || !j.contains("ttft_ms") || !j.contains("e2e_ms")) {
    Fail("ferry-load printed no JSON line:\n" + Tail(load.out, 2000));
  }
  r.requests = j.value("requests", int64_t{0});
  r.ok = j.value("ok", int64_t{0});
  if (r.requests != requests || r.ok != r.requests) {
    Fail(absl::StrCat("ferry-load: ", r.ok, " of ", r.requests, " requests ok (", requests,
                      " sent):\n", Tail(load.out, 2000)));
  }
  r.ttft_ms = j["ttft_ms"].value("mean", 0.0);
  r.ttft_p50_ms = j["ttft_ms"].value("p50", 0.0);
  r.e2e_ms = j["e2e_ms"].value("mean", 0.0);
  r.e2e_p50_ms = j["e2e_ms"].value("p50", 0.0);
  r.prompt_tokens = j.value("prompt_tokens", int64_t{0});
  r.cached_tokens = j.value("cached_tokens", int64_t{0});
  r.duration_s = j.value("duration_s", 0.0);
  r.ttft_each_s.assign(static_cast<size_t>(requests), 0.0);
  std::ifstream in(records);
  std::string line;
  while (std::getline(in, line)) {
    const auto rec = nlohmann::json::parse(line, nullptr, false);
    if (!rec.is_object()) continue;
    const int64_t id = rec.value("id", int64_t{-1});
    if (id >= 0 && id < requests) r.ttft_each_s[static_cast<size_t>(id)] = rec.value("ttft_s", 0.0);
  }
  r.wall_s = Since(wall_start);
  std::fprintf(stderr,
               "simfidelity: %-10s %-4s %.2f req/s: TTFT %8.1f ms, e2e %8.1f ms, cached %lld of "
               "%lld prompt tokens, others took %.0f%% of the CPUs (%.0f s)\n",
               setup.name.c_str(), sim ? "sim" : "real", rate, r.ttft_ms, r.e2e_ms,
               static_cast<long long>(r.cached_tokens), static_cast<long long>(r.prompt_tokens),
               r.others_share * 100, r.wall_s);
  return r;
}

// --- Calibration
// -----------------------------------------------------------------------------------

void Calibrate(const Binaries& bin, const std::string& model, Setup* setup) {
  setup->calibration = absl::StrCat(g_dir, "/calibration-", setup->name, ".json");
  std::vector<std::string> args = {"--model=" + model,
                                   absl::StrCat("--threads=", setup->threads),
                                   "--quick",
                                   "--nostore",
                                   "--out=" + setup->calibration,
                                   "--name=simfidelity " + setup->name};
  if (setup->name == "pd") {
    args.push_back("--link_kind=ucx");
    args.push_back("--link_tls=tcp");
  } else {
    args.push_back("--nolink");  // one worker: no KV hand-off
  }
  std::fprintf(stderr, "simfidelity: calibrating for %s (%d threads): %s\n", setup->label.c_str(),
               setup->threads, bin.calibrate.c_str());
  const CommandResult c = RunCommand(bin.calibrate, args, 600, "calibrate-" + setup->name);
  if (c.exit_code != 0) {
    Fail(absl::StrCat("ferry-calibrate failed (exit ", c.exit_code, "):\n", c.err_tail, "\n",
                      Tail(c.out, 3000)));
  }
  for (absl::string_view line : absl::StrSplit(c.out, '\n')) {
    if (absl::StartsWith(line, "fit over")) setup->fit_line = std::string(line);
    if (absl::StartsWith(line, "(measured in")) {
      setup->contention_line = std::string(line);
      // "(measured in 9 s; other processes took 51.8% of the CPUs meanwhile)"
      const size_t at = line.find("took ");
      double percent = 0;
      if (at != absl::string_view::npos &&
          absl::SimpleAtod(line.substr(at + 5, line.find('%', at) - at - 5), &percent)) {
        setup->calibration_others = percent / 100;
      }
    }
  }
}

// --- Report --------------------------------------------------------------------------------------

struct Row {
  const Setup* setup = nullptr;
  double rate = 0;
  RunResult real1, real2, sim;
};

double Mean2(double a, double b) { return (a + b) / 2; }
double RelError(double sim, double real) { return real > 0 ? std::abs(sim - real) / real : 0; }
double Spread(double a, double b) { return Mean2(a, b) > 0 ? std::abs(a - b) / Mean2(a, b) : 0; }
double Goal(double spread) { return std::max(0.10, 2 * spread); }

// The median over requests of sim / mean(real) TTFT, request by request (the same requests and
// arrival times in every run): below 1, the sim is faster on a typical request.
double MedianRatio(const Row& row) {
  std::vector<double> ratios;
  for (size_t i = 0; i < row.sim.ttft_each_s.size(); ++i) {
    const double real = Mean2(row.real1.ttft_each_s[i], row.real2.ttft_each_s[i]);
    if (real > 0) ratios.push_back(row.sim.ttft_each_s[i] / real);
  }
  if (ratios.empty()) return 0;
  std::sort(ratios.begin(), ratios.end());
  return ratios[ratios.size() / 2];
}

std::string WorkerName(const Setup& setup, size_t index) {
  if (setup.name != "pd") return "worker";
  return index == 0 ? "decode" : "prefill";
}

nlohmann::ordered_json StepsJson(const std::vector<Steps>& steps) {
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const Steps& s : steps) {
    nlohmann::ordered_json w;
    for (int k = 0; k < 3; ++k) {
      w[absl::StrCat(kStepKinds[k], "_s")] = s.seconds[k];
      w[absl::StrCat(kStepKinds[k], "_steps")] = s.count[k];
    }
    j.push_back(w);
  }
  return j;
}

// Per worker: the modeled step time of the sim run over the real runs' mean.
nlohmann::ordered_json StepRatios(const Row& row) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (size_t w = 0; w < row.sim.steps.size(); ++w) {
    const double real =
        Mean2(row.real1.steps[w].total_seconds(), row.real2.steps[w].total_seconds());
    j[WorkerName(*row.setup, w)] = real > 0 ? row.sim.steps[w].total_seconds() / real : 0.0;
  }
  return j;
}

bool Contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// ferry-calibrate of this binary's own build configuration (bazel-out/<config>/bin/tools/
// calibrate, beside tools/bench), else the workspace's bazel-bin.
void RequireExecutable(const std::string& path, const std::string& what) {
  if (access(path.c_str(), X_OK) != 0) {
    Fail(absl::StrCat(what, " not found at ", path,
                      what == "ferry-calibrate"
                          ? " (build it: bazel build //tools/calibrate:ferry-calibrate, or give "
                            "--calibrate_bin PATH, or skip calibrating with "
                            "--calibration_pd FILE --calibration_aggregated FILE)"
                          : ""));
  }
}

int Main(int argc, char** argv) {
  const std::string usage =
      "usage: ferry bench simfidelity [--requests N] [--rates A,B] [--setups pd,aggregated] "
      "[--quick] [--calibration_pd FILE] [--calibration_aggregated FILE] [--calibrate_bin PATH]";
  if (argc < 5) {
    Fail("usage: simfidelity_bench FERRY_ROUTER FERRY_WORKER FERRY_LOAD FERRY_CALIBRATE [flags]");
  }
  Binaries bin;
  bin.router = std::filesystem::absolute(argv[1]).string();
  bin.worker = std::filesystem::absolute(argv[2]).string();
  bin.load = std::filesystem::absolute(argv[3]).string();
  int requests = 16;
  std::vector<double> rates = {0.25, 0.5};
  std::vector<std::string> setups = {"pd", "aggregated"};
  std::string given_pd, given_aggregated, calibrate_bin;
  for (int i = 5; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(a + " needs a value; " + usage);
      return argv[++i];
    };
    if (a == "--quick") {
      requests = 8;
    } else if (a == "--requests") {
      if (!absl::SimpleAtoi(value(), &requests) || requests < 2) Fail("--requests: >= 2");
    } else if (a == "--rates") {
      rates.clear();
      for (absl::string_view v : absl::StrSplit(value(), ',')) {
        double r = 0;
        if (!absl::SimpleAtod(v, &r) || r <= 0) Fail("--rates: positive requests/s, e.g. 0.3,0.6");
        rates.push_back(r);
      }
    } else if (a == "--setups") {
      setups = absl::StrSplit(value(), ',');
      for (const std::string& s : setups) {
        if (s != "pd" && s != "aggregated") Fail("--setups: pd and/or aggregated");
      }
    } else if (a == "--calibration_pd") {
      given_pd = std::filesystem::absolute(value()).string();
    } else if (a == "--calibration_aggregated") {
      given_aggregated = std::filesystem::absolute(value()).string();
    } else if (a == "--calibrate_bin") {
      calibrate_bin = std::filesystem::absolute(value()).string();
    } else {
      Fail("unknown flag " + a + "; " + usage);
    }
  }
  const char* model_env = std::getenv("FERRY_MODEL_GGUF");
  if (model_env == nullptr) Fail("FERRY_MODEL_GGUF is not set; run ./ferry bench simfidelity");
  const std::string model = model_env;
  RequireExecutable(bin.router, "ferry-router");
  RequireExecutable(bin.worker, "ferry-worker");
  RequireExecutable(bin.load, "ferry-load");
  std::vector<Setup> all;
  const int cores = Cores();
  if (Contains(setups, "pd")) {
    Setup s;
    s.name = "pd";
    s.label = "1 prefill + 1 decode";
    s.threads = std::max(1, cores / 2);
    s.calibration = given_pd;
    all.push_back(s);
  }
  if (Contains(setups, "aggregated")) {
    Setup s;
    s.name = "aggregated";
    s.label = "1 aggregated";
    s.threads = cores;
    s.calibration = given_aggregated;
    all.push_back(s);
  }
  bool need_calibrate = false;
  for (const Setup& s : all) need_calibrate |= s.calibration.empty();
  if (need_calibrate) {
    bin.calibrate =
        calibrate_bin.empty() ? std::filesystem::absolute(argv[4]).string() : calibrate_bin;
    RequireExecutable(bin.calibrate, "ferry-calibrate");
  }
  for (const Setup& s : all) {
    if (!s.calibration.empty() && access(s.calibration.c_str(), R_OK) != 0) {
      Fail("no calibration file " + s.calibration);
    }
  }

  std::string dir_template =
      std::filesystem::temp_directory_path().string() + "/ferry-simfidelity.XXXXXX";
  if (mkdtemp(dir_template.data()) == nullptr) Fail("mkdtemp failed");
  g_dir = dir_template;
  setenv("TEST_TMPDIR", g_dir.c_str(), 1);  // ServiceProcess's logs
  const auto bench_start = Clock::now();

  // 1. Calibrate, nothing else of this bench running.
  for (Setup& s : all) {
    if (s.calibration.empty()) {
      Calibrate(bin, model, &s);
    } else {
      s.fit_line = "given: " + s.calibration;
    }
  }

  // 2. The test workload.
  const std::string trace = g_dir + "/trace.jsonl";
  const TraceSummary workload = WriteTrace(trace, requests, 26);

  // 3, 4. Real, simulated, real, per set-up and rate, each on a fresh stack.
  std::vector<Row> rows;
  for (const Setup& s : all) {
    for (double rate : rates) {
      Row row;
      row.setup = &s;
      row.rate = rate;
      row.real1 = Run(bin, s, /*sim=*/false, rate, requests, trace, model);
      row.sim = Run(bin, s, /*sim=*/true, rate, requests, trace, model);
      row.real2 = Run(bin, s, /*sim=*/false, rate, requests, trace, model);
      rows.push_back(std::move(row));
    }
  }

  // 5. The report.
  std::vector<std::string> spans;
  for (double rate : rates)
    spans.push_back(absl::StrFormat("%.0f s at %.2f/s", workload.span_s / rate, rate));
  std::printf(
      "ferry bench simfidelity: SmolLM2 (bf16) on %d cores; %d requests a run: prompts of "
      "300-1200 tokens (mean %.0f; %d open with one of 3 shared 512-token prefixes), 16-32 output "
      "tokens (mean %.1f); open loop, Poisson arrivals (fixed seed; over %s), a fresh stack per "
      "run\n",
      cores, workload.requests, static_cast<double>(workload.prompt_tokens) / workload.requests,
      workload.shared, static_cast<double>(workload.output_tokens) / workload.requests,
      absl::StrJoin(spans, ", ").c_str());
  for (const Setup& s : all) {
    std::printf("calibration %-10s (%d thread%s): %s %s\n", s.name.c_str(), s.threads,
                s.threads == 1 ? "" : "s", s.fit_line.c_str(), s.contention_line.c_str());
  }
  std::printf("\n%-22s %6s | %-34s %6s %6s %5s | %-34s %6s %6s %5s | %s\n", "", "",
              "TTFT mean ms: real1   real2     sim", "error", "spread", "goal",
              "e2e mean ms:  real1   real2     sim", "error", "spread", "goal", "met");
  nlohmann::ordered_json details = nlohmann::ordered_json::array();
  double ttft_error = 0, e2e_error = 0, spread = 0;
  bool goal_met = true;
  for (const Row& row : rows) {
    const double ttft_real = Mean2(row.real1.ttft_ms, row.real2.ttft_ms);
    const double e2e_real = Mean2(row.real1.e2e_ms, row.real2.e2e_ms);
    const double te = RelError(row.sim.ttft_ms, ttft_real);
    const double ee = RelError(row.sim.e2e_ms, e2e_real);
    const double ts = Spread(row.real1.ttft_ms, row.real2.ttft_ms);
    const double es = Spread(row.real1.e2e_ms, row.real2.e2e_ms);
    const bool met = te <= Goal(ts) && ee <= Goal(es);
    ttft_error = std::max(ttft_error, te);
    e2e_error = std::max(e2e_error, ee);
    spread = std::max({spread, ts, es});
    goal_met &= met;
    std::printf(
        "%-22s %4.2f/s | %19.1f %7.1f %7.1f %5.1f%% %5.1f%% %4.0f%% | %19.1f %7.1f %7.1f %5.1f%% "
        "%5.1f%% %4.0f%% | %s\n",
        row.setup->label.c_str(), row.rate, row.real1.ttft_ms, row.real2.ttft_ms, row.sim.ttft_ms,
        te * 100, ts * 100, Goal(ts) * 100, row.real1.e2e_ms, row.real2.e2e_ms, row.sim.e2e_ms,
        ee * 100, es * 100, Goal(es) * 100, met ? "yes" : "NO");
    auto run_json = [](const RunResult& r) {
      return nlohmann::ordered_json{{"ttft_mean_ms", r.ttft_ms},
                                    {"ttft_p50_ms", r.ttft_p50_ms},
                                    {"e2e_mean_ms", r.e2e_ms},
                                    {"e2e_p50_ms", r.e2e_p50_ms},
                                    {"cached_tokens", r.cached_tokens},
                                    {"prompt_tokens", r.prompt_tokens},
                                    {"duration_s", r.duration_s},
                                    {"workers_cpu_s", r.workers_cpu_s},
                                    {"router_cpu_s", r.router_cpu_s},
                                    {"load_cpu_s", r.load_cpu_s},
                                    {"others_cpu_share", r.others_share},
                                    {"steal_share", r.steal_share},
                                    {"steps", StepsJson(r.steps)}};
    };
    details.push_back({{"setup", row.setup->name},
                       {"threads", row.setup->threads},
                       {"rate", row.rate},
                       {"ttft_error", te},
                       {"e2e_error", ee},
                       {"ttft_spread", ts},
                       {"e2e_spread", es},
                       {"goal_met", met},
                       {"ttft_sim_over_real_median_request", MedianRatio(row)},
                       {"step_time_sim_over_real", StepRatios(row)},
                       {"real1", run_json(row.real1)},
                       {"sim", run_json(row.sim)},
                       {"real2", run_json(row.real2)}});
  }
  std::printf("\nper run (real1 / sim / real2):\n");
  std::printf("%-22s %6s | %-25s | %-19s | %-21s | %-17s | %s\n", "", "", "cached of prompt tokens",
              "workers CPU s", "router, load CPU s", "others' CPU share",
              "sim/real TTFT, median request");
  for (const Row& row : rows) {
    std::printf(
        "%-22s %4.2f/s | %5lld/%5lld/%5lld of %5lld | %5.1f / %4.1f / %5.1f | "
        "%4.1f %4.1f / %4.1f %4.1f | %3.0f%% / %3.0f%% / %3.0f%% | %.2f\n",
        row.setup->label.c_str(), row.rate, static_cast<long long>(row.real1.cached_tokens),
        static_cast<long long>(row.sim.cached_tokens),
        static_cast<long long>(row.real2.cached_tokens),
        static_cast<long long>(row.real1.prompt_tokens), row.real1.workers_cpu_s,
        row.sim.workers_cpu_s, row.real2.workers_cpu_s, row.real1.router_cpu_s,
        row.real1.load_cpu_s, row.sim.router_cpu_s, row.sim.load_cpu_s,
        row.real1.others_share * 100, row.sim.others_share * 100, row.real2.others_share * 100,
        MedianRatio(row));
  }
  // Where the time goes: the engine's steps, real (timed by the engine) against modeled (what the
  // calibration says the same kind of work takes), per worker.
  std::printf("\nengine steps during the workload (real1 / sim / real2): seconds (steps)\n");
  std::printf("%-22s %6s | %-8s | %-38s | %-38s | %-38s | %s\n", "", "", "worker", "prefill",
              "decode", "mixed", "sim/real step time");
  for (const Row& row : rows) {
    for (size_t w = 0; w < row.sim.steps.size(); ++w) {
      const Steps& a = row.real1.steps[w];
      const Steps& b = row.sim.steps[w];
      const Steps& c = row.real2.steps[w];
      std::string cells;
      for (int k = 0; k < 3; ++k) {
        absl::StrAppend(&cells, absl::StrFormat("%5.1f(%4.0f) / %5.1f(%4.0f) / %5.1f(%4.0f) | ",
                                                a.seconds[k], a.count[k], b.seconds[k], b.count[k],
                                                c.seconds[k], c.count[k]));
      }
      const double real = Mean2(a.total_seconds(), c.total_seconds());
      std::printf("%-22s %4.2f/s | %-8s | %s%.2f\n", w == 0 ? row.setup->label.c_str() : "",
                  row.rate, WorkerName(*row.setup, w).c_str(), cells.c_str(),
                  real > 0 ? b.total_seconds() / real : 0.0);
    }
  }
  // A neighbour's load slows the real runs, never the simulated ones (nor evenly the two real
  // runs of a row): the spread, and the goal it sets, say as much about it as about the stack.
  double others_max = 0;
  for (const Row& row : rows) {
    others_max = std::max({others_max, row.real1.others_share, row.real2.others_share});
  }
  double calibration_others_max = 0;
  for (const Setup& s : all)
    calibration_others_max = std::max(calibration_others_max, s.calibration_others);
  if (others_max > 0.2 || calibration_others_max > 0.2) {
    std::printf(
        "\nWARNING: other processes took up to %.0f%% of the CPUs during the real runs and %.0f%% "
        "during a calibration: the real runs and the fitted steps are slower than this machine "
        "(most with 2 threads a worker: a busy core stalls every step), by amounts that vary from "
        "run to run; run it on a quiet machine for a tighter test\n",
        others_max * 100, calibration_others_max * 100);
  }
  std::printf(
      "\ngoal: error <= max(10%%, 2 x spread) for TTFT and e2e in every row: %s (%.0f s)\n\n",
      goal_met ? "met" : "NOT met", Since(bench_start));

  nlohmann::ordered_json j;
  j["bench"] = "simfidelity";
  j["ttft_error"] = ttft_error;
  j["e2e_error"] = e2e_error;
  j["spread"] = spread;
  j["goal_met"] = goal_met;
  j["others_cpu_share_max"] = others_max;
  j["requests_per_run"] = requests;
  j["rates"] = rates;
  j["calibrations"] = nlohmann::ordered_json::object();
  for (const Setup& s : all) {
    nlohmann::ordered_json c = {{"threads", s.threads},
                                {"fit", s.fit_line},
                                {"measured", s.contention_line},
                                {"others_cpu_share", s.calibration_others}};
    const auto file = nlohmann::json::parse(ReadFile(s.calibration), nullptr, false);
    if (file.is_object()) {
      for (const char* key :
           {"step_overhead_s", "prefill_token_s", "prefill_attention_s", "decode_step_s",
            "decode_row_s", "decode_kv_token_s", "link_bandwidth_bytes_per_s", "link_latency_s"}) {
        if (file.contains(key)) c[key] = file[key];
      }
    }
    j["calibrations"][s.name] = c;
  }
  j["rows"] = details;
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
  std::filesystem::remove_all(g_dir);
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
