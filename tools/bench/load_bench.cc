// ferry bench load: the load tool (ferry-load) checked against aiperf, the reference client, on
// the same stack and the same workload shape. A ferry-router (least_loaded) in front of two
// ferry-workers on the null engine with known latencies (prefill at --prefill_tps tokens/s, a
// decode step of --token_ms; one prefill step a prompt: prefill_chunk and max_batch_tokens above
// the prompt) serves --isl-token prompts with --osl output tokens (ignore_eos, temperature 0):
//
//   closed loop  --concurrency users, --requests requests: ferry-load, then aiperf --concurrency;
//   open loop    --rate requests/s at constant gaps (no sampling noise: both tools offer the same
//                load), --open_requests requests: ferry-load --arrivals constant, then aiperf
//                --request-rate --arrival-pattern constant.
//
// Compared: mean TTFT and output-token throughput, ferry-load over aiperf (goal: within 10%),
// and each against the null engine's model (P = isl / prefill_tps, T = token_ms):
//   closed  the users fall into lockstep: a worker's k = concurrency / 2 users send together
//           (they started together and ask for equal lengths), so their prompts share one
//           prefill step on an idle worker: TTFT = k P, e2e = k P + (osl - 1) T, throughput =
//           concurrency x osl / e2e;
//   open    arrivals are spread: one waits half a step of the requests decoding, then its prefill
//           step (which also decodes the others) lasts P + T: TTFT = P + 1.5 T; e2e = TTFT +
//           (osl - 1) T + (k - 1) P (each of the k - 1 others on its worker inserts a prefill;
//           k = rate x e2e / 2); throughput = requests x osl / ((requests - 1) / rate + e2e).
// The model ignores the router and the clients.
// What the comparison needs from aiperf: --extra-inputs temperature:0 (aiperf sends no
// temperature, and OpenAI's default of 1 samples over the whole vocabulary, which costs the
// workers CPU per token: every stream was a quarter slower here, for both tools), and constant
// arrivals on its synthetic prompts rather than a replay of the same schedule through its
// mooncake_trace loader (whose TTFTs were ~50 ms above both ferry-load's and aiperf's own
// synthetic open loop on the same schedule here).
// The servers run at nice -10 (when allowed) so that the clients' CPU (aiperf is several Python
// processes) slows the server they measure as little as possible on a small machine; a client's
// own delays still count in what it reports. aiperf gets a local HF tokenizer directory made here
// from the model's GGUF by transformers (the reference venv), counts tokens from the server's
// usage (--use-server-token-count) and runs in the client venv, offline.
//
// Needs FERRY_MODEL_GGUF, FERRY_CLIENT_PYTHON (aiperf) and FERRY_REF_PYTHON (transformers);
// `./ferry bench load` sets them. Prints a table, then one JSON line.

#include <dirent.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "tests/integration/service_process.h"

namespace ferry {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "load_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// Runs `command` (sh -c), its stdout to `out`, both streams also kept in `log`; the exit status.
int Run(const std::string& command, const std::string& log, std::string* out) {
  const std::string full = absl::StrCat("(", command, ") 2>>", Quote(log));
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) Die("popen " + command);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) {
    if (out != nullptr) out->append(buf, n);
  }
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string Tail(const std::string& path, size_t bytes = 3000) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  const std::string all = s.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

// Lowers the nice value of every thread of `pid` (new threads inherit it). False when not allowed.
bool Renice(pid_t pid, int nice) {
  const std::string dir = absl::StrCat("/proc/", pid, "/task");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool ok = true;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    ok = setpriority(PRIO_PROCESS, static_cast<id_t>(std::atoi(e->d_name)), nice) == 0 && ok;
  }
  closedir(d);
  return ok;
}

struct Flags {
  int requests = 160, open_requests = 90, concurrency = 8;
  double rate = 3;
  int isl = 512, osl = 32;
  double token_ms = 40, prefill_tps = 5120;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 4; i + 1 < argc; i += 2) {
    const std::string name = argv[i], value = argv[i + 1];
    if (name == "--requests") {
      f.requests = std::max(8, std::atoi(value.c_str()));
    } else if (name == "--open_requests") {
      f.open_requests = std::max(8, std::atoi(value.c_str()));
    } else if (name == "--concurrency") {
      f.concurrency = std::max(2, std::atoi(value.c_str()));
    } else if (name == "--rate") {
      f.rate = std::max(0.1, std::atof(value.c_str()));
    } else if (name == "--isl") {
      f.isl = std::max(16, std::atoi(value.c_str()));
    } else if (name == "--osl") {
      f.osl = std::max(2, std::atoi(value.c_str()));
    } else if (name == "--token_ms") {
      f.token_ms = std::max(1.0, std::atof(value.c_str()));
    } else if (name == "--prefill_tps") {
      f.prefill_tps = std::max(100.0, std::atof(value.c_str()));
    } else {
      Die("unknown flag " + name);
    }
  }
  return f;
}

// What one client measured.
struct Measured {
  double ttft_ms = 0, throughput = 0, itl_ms = 0, prompt_tokens = 0;
  int64_t ok = 0, failed = 0;
  double wall_s = 0;  // the whole command, startup included
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Main(int argc, char** argv) {
  if (argc < 4) Die("usage: load_bench FERRY_ROUTER FERRY_WORKER FERRY_LOAD [--flag value]...");
  const std::string router_bin = argv[1], worker_bin = argv[2], load_bin = argv[3];
  const Flags f = ParseFlags(argc, argv);
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') {
      Die(absl::StrCat(name, " is not set (./ferry bench load sets it)"));
    }
    return std::string(v);
  };
  const std::string gguf = env("FERRY_MODEL_GGUF");
  const std::string client_python = env("FERRY_CLIENT_PYTHON");
  const std::string ref_python = env("FERRY_REF_PYTHON");
  const std::string aiperf_bin =
      std::filesystem::path(client_python).parent_path().string() + "/aiperf";
  if (access(aiperf_bin.c_str(), X_OK) != 0) {
    Die("no aiperf in the client venv (" + aiperf_bin + "): run ./ferry setup");
  }
  const char* tmp_root = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(tmp_root != nullptr ? tmp_root : "/tmp", "/ferry-load-bench.XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) Die("mkdtemp");
  const std::string log = dir + "/clients.log";
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};

  // 1. aiperf's tokenizer: the GGUF's, as an HF directory (transformers reads GGUF tokenizers),
  // laid out as the snapshot of a repository "ferry/tokenizer" in a private HF_HOME. aiperf runs
  // offline (HF_HUB_OFFLINE=1: it never reaches for the hub), and offline aiperf 0.13.0 resolves
  // a plain directory path through huggingface_hub's snapshot_download, which rejects it
  // (HFValidationError); a cached repository id it resolves to the directory.
  const std::string hf_home = dir + "/hf";
  const std::string repo = hf_home + "/hub/models--ferry--tokenizer";
  const std::string tokenizer_dir = repo + "/snapshots/local";
  std::filesystem::create_directories(repo + "/refs");
  std::ofstream(repo + "/refs/main") << "local";
  const std::string script = absl::StrCat(
      "import os, sys\nfrom transformers import AutoTokenizer\n", "g = sys.argv[1]\n",
      "t = AutoTokenizer.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g))\n",
      "t.save_pretrained(sys.argv[2])\n");
  {
    std::ofstream(dir + "/make_tokenizer.py") << script;
    if (Run(absl::StrCat(Quote(ref_python), " ", Quote(dir + "/make_tokenizer.py"), " ",
                         Quote(gguf), " ", Quote(tokenizer_dir), " >/dev/null"),
            log, nullptr) != 0) {
      Die("could not write the HF tokenizer for aiperf:\n" + Tail(log));
    }
  }

  // 2. The stack.
  const std::vector<std::string> worker_args = {
      "--model=" + gguf,
      "--engine=null",
      absl::StrCat("--null_prefill_tokens_per_second=", f.prefill_tps),
      absl::StrCat("--null_token_seconds=", f.token_ms / 1e3),
      "--threads=1",
      "--kv_pool_bytes=256MiB",
      "--max_running=256",
      "--max_queued=1024",
      absl::StrCat("--prefill_chunk=", std::max(1024, f.isl)),
      absl::StrCat("--max_batch_tokens=", std::max(4096, 4 * f.isl))};
  ServiceProcess w0(worker_bin, worker_args), w1(worker_bin, worker_args);
  if (!w0.ready() || !w1.ready()) Die("a worker did not start: " + w0.LogTail() + w1.LogTail());
  const std::string model = "smol";
  ServiceProcess router(router_bin, {"--model=" + gguf, "--served_model_name=" + model,
                                     "--workers=" + w0.address() + "," + w1.address(),
                                     "--policy=least_loaded", "--max_queued=1024", "--threads=2"});
  if (!router.ready()) Die("the router did not start: " + router.LogTail());
  bool reniced = true;
  for (pid_t pid : {w0.pid(), w1.pid(), router.pid()}) reniced = Renice(pid, -10) && reniced;
  for (int i = 0;; ++i) {  // until the router sees both workers
    std::string body;
    if (HttpGet(router.admin_port(), "/workers", &body) == 200) {
      const auto j = nlohmann::json::parse(body, nullptr, false);
      int up = 0;
      if (j.is_array()) {
        for (const auto& w : j) up += w.value("state", "") == "up" ? 1 : 0;
      }
      if (up == 2) break;
    }
    if (i > 600) Die("the router did not see its workers: " + router.LogTail());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string url = absl::StrCat("http://127.0.0.1:", router.grpc_port());

  auto ferry_load = [&](const std::vector<std::string>& extra, uint64_t seed, int requests) {
    std::vector<std::string> args = {
        Quote(load_bin),
        "--url=" + url,
        "--model=" + model,
        "--workload=shared_prefix",
        "--groups=1",
        absl::StrCat("--prompts_per_group=", requests),
        "--system_tokens=0",
        absl::StrCat("--question_tokens=", f.isl),
        absl::StrCat("--output_tokens=", f.osl),
        absl::StrCat("--seed=", seed),
        "--progress=false",
        absl::StrCat("--admin_url=http://127.0.0.1:", router.admin_port())};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string out;
    const auto start = std::chrono::steady_clock::now();
    if (Run(absl::StrJoin(args, " "), log, &out) != 0) Die("ferry-load failed:\n" + Tail(log));
    const size_t last = out.find_last_of('\n', out.size() - 2);
    const auto j =
        nlohmann::json::parse(out.substr(last == std::string::npos ? 0 : last + 1), nullptr, false);
    if (!j.is_object()) Die("ferry-load printed no JSON line:\n" + out);
    Measured m;
    m.ttft_ms = j["ttft_ms"]["mean"].get<double>();
    m.itl_ms = j["tpot_ms"]["mean"].get<double>();
    m.throughput = j["output_token_throughput"].get<double>();
    m.prompt_tokens =
        j["prompt_tokens"].get<double>() / std::max<int64_t>(1, j["ok"].get<int64_t>());
    m.ok = j["ok"].get<int64_t>();
    m.failed = j["failed"].get<int64_t>();
    m.wall_s = Seconds(start);
    return std::make_pair(m, j);
  };
  int aiperf_runs = 0;
  auto aiperf = [&](const std::vector<std::string>& extra, int requests) {
    const std::string artifacts = absl::StrCat(dir, "/aiperf", ++aiperf_runs);
    std::vector<std::string> args = {"HF_HUB_OFFLINE=1",
                                     "TRANSFORMERS_OFFLINE=1",
                                     "HF_HOME=" + Quote(hf_home),
                                     Quote(aiperf_bin),
                                     "profile",
                                     "--model",
                                     model,
                                     "--url",
                                     url,
                                     "--endpoint-type",
                                     "completions",
                                     "--streaming",
                                     "--tokenizer",
                                     "ferry/tokenizer",
                                     "--isl",
                                     absl::StrCat(f.isl),
                                     "--prompt-input-tokens-stddev",
                                     "0",
                                     "--osl",
                                     absl::StrCat(f.osl),
                                     "--prompt-output-tokens-stddev",
                                     "0",
                                     "--use-legacy-max-tokens",
                                     "--extra-inputs",
                                     "ignore_eos:true",
                                     "--extra-inputs",
                                     "temperature:0",
                                     "--use-server-token-count",
                                     "--request-count",
                                     absl::StrCat(requests),
                                     "--random-seed",
                                     absl::StrCat(aiperf_runs),
                                     "--ui",
                                     "none",
                                     "--no-server-metrics",
                                     "--workers-max",
                                     "1",
                                     "--record-processors",
                                     "1",
                                     "--artifact-dir",
                                     Quote(artifacts)};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto start = std::chrono::steady_clock::now();
    const int rc = Run(absl::StrJoin(args, " ") + " >>" + Quote(log), log, nullptr);
    std::ifstream in(artifacts + "/profile_export_aiperf.json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (rc != 0 || !j.is_object() || !j.contains("time_to_first_token")) {
      Die(absl::StrCat("aiperf failed (exit ", rc, "):\n", Tail(log)));
    }
    Measured m;
    m.ttft_ms = j["time_to_first_token"]["avg"].get<double>();
    m.itl_ms = j["inter_token_latency"]["avg"].get<double>();
    m.throughput = j["output_token_throughput"]["avg"].get<double>();
    m.prompt_tokens = j["input_sequence_length"]["avg"].get<double>();
    m.ok = j["request_count"]["avg"].get<int64_t>();
    m.failed =
        j.contains("error_request_count") ? j["error_request_count"]["avg"].get<int64_t>() : 0;
    m.wall_s = Seconds(start);
    return m;
  };

  // 3. A few requests first, so that neither tool meets a cold server.
  ferry_load({"--mode=closed", "--concurrency=2"}, 99, 4);
  const auto [ferry_closed, ferry_closed_json] =
      ferry_load({"--mode=closed", absl::StrCat("--concurrency=", f.concurrency)}, 1, f.requests);
  const Measured aiperf_closed = aiperf({"--concurrency", absl::StrCat(f.concurrency)}, f.requests);
  const auto [ferry_open, ferry_open_json] = ferry_load(
      {"--mode=open", absl::StrCat("--rate=", f.rate), "--arrivals=constant"}, 2, f.open_requests);
  const Measured aiperf_open = aiperf(
      {"--request-rate", absl::StrCat(f.rate), "--arrival-pattern", "constant"}, f.open_requests);

  // 4. The null engine's model.
  const double p = f.isl / f.prefill_tps, t = f.token_ms / 1e3;
  const double k_closed = f.concurrency / 2.0;
  const double closed_ttft = k_closed * p;
  const double closed_e2e = closed_ttft + (f.osl - 1) * t;
  const double closed_model = f.concurrency * f.osl / closed_e2e;
  const double open_ttft = p + 1.5 * t;
  auto open_e2e_of = [&](double k) {
    return open_ttft + (f.osl - 1) * t + std::max(0.0, k - 1) * p;
  };
  double open_e2e = open_e2e_of(1);
  for (int i = 0; i < 20; ++i) open_e2e = open_e2e_of(f.rate * open_e2e / 2);
  const double open_model = f.open_requests * f.osl / ((f.open_requests - 1) / f.rate + open_e2e);

  struct Row {
    const char* name;
    Measured m;
    double ttft_model, throughput_model;
  };
  const std::vector<Row> rows = {{"closed  ferry-load", ferry_closed, closed_ttft, closed_model},
                                 {"closed  aiperf", aiperf_closed, closed_ttft, closed_model},
                                 {"open    ferry-load", ferry_open, open_ttft, open_model},
                                 {"open    aiperf", aiperf_open, open_ttft, open_model}};
  std::printf(
      "ferry bench load: router + 2 null workers (prefill %.0f tok/s, %.0f ms a decode step), "
      "%d-token prompts, %d output tokens; servers %s\n"
      "closed: %d users, %d requests; open: %.3g req/s constant, %d requests\n\n",
      f.prefill_tps, f.token_ms, f.isl, f.osl, reniced ? "at nice -10" : "at normal priority",
      f.concurrency, f.requests, f.rate, f.open_requests);
  std::printf("%-20s %9s %9s %10s %9s %9s %8s %8s %8s\n", "", "TTFT ms", "TPOT ms", "out tok/s",
              "prompt", "ok/fail", "TTFT/mdl", "tput/mdl", "wall s");
  for (const Row& r : rows) {
    std::printf("%-20s %9.1f %9.2f %10.1f %9.1f %5lld/%-3lld %8.2f %8.2f %8.1f\n", r.name,
                r.m.ttft_ms, r.m.itl_ms, r.m.throughput, r.m.prompt_tokens,
                static_cast<long long>(r.m.ok), static_cast<long long>(r.m.failed),
                r.m.ttft_ms / 1e3 / r.ttft_model, r.m.throughput / r.throughput_model, r.m.wall_s);
  }
  const double closed_ttft_ratio = ferry_closed.ttft_ms / aiperf_closed.ttft_ms;
  const double closed_tput_ratio = ferry_closed.throughput / aiperf_closed.throughput;
  const double open_ttft_ratio = ferry_open.ttft_ms / aiperf_open.ttft_ms;
  const double open_tput_ratio = ferry_open.throughput / aiperf_open.throughput;
  std::printf(
      "\nmodel: closed TTFT %.1f ms, %.1f tok/s (e2e %.0f ms); open TTFT %.1f ms, %.1f tok/s "
      "(e2e %.0f ms)\n"
      "ferry-load / aiperf: closed TTFT %.3f, throughput %.3f; open TTFT %.3f, throughput %.3f"
      " (goal: within 10%%)\n"
      "economics of the closed run (ferry-load): revenue %.6f %s, %.3f %s per GPU-hour over %d "
      "GPUs\n\n",
      closed_ttft * 1e3, closed_model, closed_e2e * 1e3, open_ttft * 1e3, open_model,
      open_e2e * 1e3, closed_ttft_ratio, closed_tput_ratio, open_ttft_ratio, open_tput_ratio,
      ferry_closed_json["economics"]["revenue"].get<double>(),
      ferry_closed_json["economics"]["currency"].get<std::string>().c_str(),
      ferry_closed_json["economics"]["revenue_per_gpu_hour"].get<double>(),
      ferry_closed_json["economics"]["currency"].get<std::string>().c_str(),
      ferry_closed_json["economics"]["gpus"].get<int>());
  auto within = [](double r) { return std::fabs(r - 1) <= 0.10; };
  nlohmann::ordered_json j;
  j["bench"] = "load";
  j["ttft_ratio_vs_aiperf"] = closed_ttft_ratio;
  j["throughput_ratio_vs_aiperf"] = closed_tput_ratio;
  j["open_ttft_ratio_vs_aiperf"] = open_ttft_ratio;
  j["open_throughput_ratio_vs_aiperf"] = open_tput_ratio;
  j["ferry_closed"] = {{"ttft_ms", ferry_closed.ttft_ms},
                       {"tpot_ms", ferry_closed.itl_ms},
                       {"output_tok_s", ferry_closed.throughput}};
  j["aiperf_closed"] = {{"ttft_ms", aiperf_closed.ttft_ms},
                        {"itl_ms", aiperf_closed.itl_ms},
                        {"output_tok_s", aiperf_closed.throughput}};
  j["ferry_open"] = {{"ttft_ms", ferry_open.ttft_ms},
                     {"tpot_ms", ferry_open.itl_ms},
                     {"output_tok_s", ferry_open.throughput}};
  j["aiperf_open"] = {{"ttft_ms", aiperf_open.ttft_ms},
                      {"itl_ms", aiperf_open.itl_ms},
                      {"output_tok_s", aiperf_open.throughput}};
  j["model"] = {{"closed_ttft_ms", closed_ttft * 1e3},
                {"closed_output_tok_s", closed_model},
                {"open_ttft_ms", open_ttft * 1e3},
                {"open_output_tok_s", open_model}};
  j["vs_model"] = {{"ferry_closed",
                    {{"ttft", ferry_closed.ttft_ms / 1e3 / closed_ttft},
                     {"throughput", ferry_closed.throughput / closed_model}}},
                   {"aiperf_closed",
                    {{"ttft", aiperf_closed.ttft_ms / 1e3 / closed_ttft},
                     {"throughput", aiperf_closed.throughput / closed_model}}},
                   {"ferry_open",
                    {{"ttft", ferry_open.ttft_ms / 1e3 / open_ttft},
                     {"throughput", ferry_open.throughput / open_model}}},
                   {"aiperf_open",
                    {{"ttft", aiperf_open.ttft_ms / 1e3 / open_ttft},
                     {"throughput", aiperf_open.throughput / open_model}}}};
  j["economics_closed"] = ferry_closed_json["economics"];
  j["servers_reniced"] = reniced;
  j["goals_met"] = {{"closed_ttft", within(closed_ttft_ratio)},
                    {"closed_throughput", within(closed_tput_ratio)},
                    {"open_ttft", within(open_ttft_ratio)},
                    {"open_throughput", within(open_tput_ratio)}};
  std::printf("%s\n", j.dump().c_str());
  (void)ferry_open_json;
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::Main(argc, argv); }
