// ferry-load: load on a running Ferry router (or any OpenAI-compatible server), closed loop (N
// users) or open loop (Poisson, a trace's own times, or a day-shaped load envelope over either:
// tools/load/envelope.h), on synthetic shared-prefix prompts,
// multi-turn agent sessions or a Mooncake trace; reports TTFT, ITL, TPOT, e2e, throughput, cache
// hits, goodput under SLOs and the economics, then one JSON line (load_tool.h).
//
//   ferry-load --mode closed --concurrency 16 --workload shared_prefix --groups 4
//   ferry-load --mode open --rate 4 --workload sessions --sessions 16 --turns 4
//   ferry-load --mode open --workload trace --trace trace.jsonl --time_scale 0.1 --limit 200
//   ferry-load --mode open --workload trace --trace trace.jsonl --envelope sine \
//       --envelope_period 600 --envelope_peak 4

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "services/common/command_line.h"
#include "tools/load/load_tool.h"
#include "tools/load/workload_flags.h"

ABSL_FLAG(std::string, url, "http://127.0.0.1:8000", "the router's base URL");
ABSL_FLAG(std::string, model, "", "the model to ask for (default: the first of GET /v1/models)");
ABSL_FLAG(std::string, api, "completions",
          "completions (prompts as token ids) or chat (prompts decoded to text with --tokenizer; "
          "sessions resend the real replies)");
ABSL_FLAG(std::string, mode, "closed", "closed (--concurrency users) or open (--rate, a trace)");
ABSL_FLAG(int, concurrency, 8, "closed loop: users, each sending its next request at once");
ABSL_FLAG(int, max_inflight, 1024, "open loop: requests in flight at most (the rest wait)");
ABSL_FLAG(absl::Duration, request_timeout, absl::Minutes(5), "a request's deadline");
ABSL_FLAG(bool, ignore_eos, true, "ask for exactly max_tokens (vLLM's ignore_eos)");
ABSL_FLAG(bool, progress, true, "a progress line on stderr every second");

ABSL_FLAG(int, token_base, 1000, "prompt ids are drawn from [token_base, +token_range)");
ABSL_FLAG(int, token_range, 20000, "see --token_base");
ABSL_FLAG(std::string, tokenizer, "",
          "api chat: a GGUF file or HF directory (default: $FERRY_MODEL_GGUF)");

ABSL_FLAG(int, gpus, 0, "GPUs of the served system (0: the workers --admin_url lists, else 1)");
ABSL_FLAG(std::string, admin_url, "", "the router's admin URL (GET /workers counts the GPUs)");
ABSL_FLAG(std::string, records_out, "", "a file for one JSON line per request");

namespace {

ferry::LoadToolOptions OptionsFromFlags() {
  ferry::LoadToolOptions o;
  o.load.url = absl::GetFlag(FLAGS_url);
  o.load.model = absl::GetFlag(FLAGS_model);
  o.load.api = absl::GetFlag(FLAGS_api);
  o.load.mode = absl::GetFlag(FLAGS_mode);
  o.load.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.load.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  o.load.request_timeout = absl::GetFlag(FLAGS_request_timeout);
  o.load.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  o.load.progress = absl::GetFlag(FLAGS_progress) ? stderr : nullptr;
  o.workload = ferry::WorkloadOptionsFromFlags();
  o.workload.tokens.token_base = static_cast<ferry::TokenId>(absl::GetFlag(FLAGS_token_base));
  o.workload.tokens.token_range = static_cast<ferry::TokenId>(absl::GetFlag(FLAGS_token_range));
  o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  if (o.tokenizer.empty()) {
    if (const char* gguf = std::getenv("FERRY_MODEL_GGUF"); gguf != nullptr) o.tokenizer = gguf;
  }

  o.gpus = absl::GetFlag(FLAGS_gpus);
  o.admin_url = absl::GetFlag(FLAGS_admin_url);
  o.slo = ferry::SloFromFlags();
  o.prices = ferry::PricesFromFlags();
  o.records_out = absl::GetFlag(FLAGS_records_out);
  return o;
}

// One socket per request in flight: lift the soft limit on open files to the hard one.
void RaiseOpenFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  ferry::ParseProgramCommandLine(
      "ferry-load", "load on a Ferry router (closed or open loop), and its report", argc, argv);
  RaiseOpenFileLimit();
  if (absl::Status s = ferry::RunLoadTool(OptionsFromFlags(), stdout); !s.ok()) {
    std::fprintf(stderr, "ferry-load: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
