// ferry-load: load on a running Ferry router (or any OpenAI-compatible server), closed loop (N
// users) or open loop (Poisson, or a trace's own times), on synthetic shared-prefix prompts,
// multi-turn agent sessions or a Mooncake trace; reports TTFT, ITL, TPOT, e2e, throughput, cache
// hits, goodput under SLOs and the economics, then one JSON line (load_tool.h).
//
//   ferry-load --mode closed --concurrency 16 --workload shared_prefix --groups 4
//   ferry-load --mode open --rate 4 --workload sessions --sessions 16 --turns 4
//   ferry-load --mode open --workload trace --trace trace.jsonl --time_scale 0.1 --limit 200

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "tools/load/load_tool.h"

ABSL_FLAG(std::string, url, "http://127.0.0.1:8000", "the router's base URL");
ABSL_FLAG(std::string, model, "", "the model to ask for (default: the first of GET /v1/models)");
ABSL_FLAG(std::string, api, "completions",
          "completions (prompts as token ids) or chat (prompts decoded to text with --tokenizer; "
          "sessions resend the real replies)");
ABSL_FLAG(std::string, mode, "closed", "closed (--concurrency users) or open (--rate, a trace)");
ABSL_FLAG(int, concurrency, 8, "closed loop: users, each sending its next request at once");
ABSL_FLAG(double, rate, 0,
          "open loop: Poisson arrivals, requests/s (0: a trace's own times x --time_scale)");
ABSL_FLAG(std::string, arrivals, "poisson",
          "open loop with --rate: poisson, or constant (gaps of 1/rate: no sampling noise)");
ABSL_FLAG(int, max_inflight, 1024, "open loop: requests in flight at most (the rest wait)");
ABSL_FLAG(absl::Duration, request_timeout, absl::Minutes(5), "a request's deadline");
ABSL_FLAG(bool, ignore_eos, true, "ask for exactly max_tokens (vLLM's ignore_eos)");
ABSL_FLAG(bool, progress, true, "a progress line on stderr every second");
ABSL_FLAG(uint64_t, seed, 1, "the workload's ids and order, and the Poisson arrivals");

ABSL_FLAG(std::string, workload, "shared_prefix", "shared_prefix, sessions or trace");
ABSL_FLAG(int64_t, groups, 8, "shared_prefix: groups (each its own system prompt)");
ABSL_FLAG(int64_t, prompts_per_group, 16, "shared_prefix: prompts a group");
ABSL_FLAG(int64_t, system_tokens, 1024, "shared_prefix: the system prompt's tokens");
ABSL_FLAG(int64_t, question_tokens, 64, "shared_prefix: each prompt's own tokens");
ABSL_FLAG(std::string, order, "random", "shared_prefix: random or interleaved");
ABSL_FLAG(int64_t, output_tokens, 32, "shared_prefix and sessions: output tokens a request");
ABSL_FLAG(int64_t, sessions, 8, "sessions: sessions");
ABSL_FLAG(int64_t, turns, 4, "sessions: turns a session");
ABSL_FLAG(int64_t, first_tokens, 1024, "sessions: the first turn's prompt");
ABSL_FLAG(int64_t, turn_tokens, 64, "sessions: new tokens a later turn adds");
ABSL_FLAG(double, think_s, 0, "sessions: seconds between a reply and the next turn");
ABSL_FLAG(std::string, trace, "", "trace: a Mooncake JSONL file");
ABSL_FLAG(double, time_scale, 1.0, "trace: arrival times x this (0.5: twice the rate)");
ABSL_FLAG(int64_t, block_tokens, 64, "trace: tokens one 512-token hash id becomes");
ABSL_FLAG(int64_t, max_context, 8192, "trace: longer requests (prompt + output) are dropped");
ABSL_FLAG(int64_t, max_output, 0, "trace: output lengths capped here (0: none)");
ABSL_FLAG(int64_t, limit, 0, "trace: the first N lines only (0: all)");
ABSL_FLAG(int, token_base, 1000, "prompt ids are drawn from [token_base, +token_range)");
ABSL_FLAG(int, token_range, 20000, "see --token_base");
ABSL_FLAG(std::string, tokenizer, "",
          "api chat: a GGUF file or HF directory (default: $FERRY_MODEL_GGUF)");

ABSL_FLAG(int, gpus, 0, "GPUs of the served system (0: the workers --admin_url lists, else 1)");
ABSL_FLAG(std::string, admin_url, "", "the router's admin URL (GET /workers counts the GPUs)");
ABSL_FLAG(double, slo_ttft_ms, 0, "goodput: TTFT limit, ms (0: none)");
ABSL_FLAG(double, slo_tpot_ms, 0, "goodput: time per output token limit, ms (0: none)");
ABSL_FLAG(double, price_hit, 0.02, "price per million cache-hit input tokens");
ABSL_FLAG(double, price_miss, 1.0, "price per million cache-miss input tokens");
ABSL_FLAG(double, price_output, 4.0, "price per million output tokens");
ABSL_FLAG(std::string, currency, "CNY", "the prices' currency (defaults: DeepSeek off-peak, yuan)");
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
  o.rate = absl::GetFlag(FLAGS_rate);
  o.arrivals = absl::GetFlag(FLAGS_arrivals);
  o.seed = absl::GetFlag(FLAGS_seed);

  o.workload = absl::GetFlag(FLAGS_workload);
  o.shared_prefix.groups = absl::GetFlag(FLAGS_groups);
  o.shared_prefix.prompts_per_group = absl::GetFlag(FLAGS_prompts_per_group);
  o.shared_prefix.system_tokens = absl::GetFlag(FLAGS_system_tokens);
  o.shared_prefix.question_tokens = absl::GetFlag(FLAGS_question_tokens);
  o.shared_prefix.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  o.shared_prefix.order = absl::GetFlag(FLAGS_order);
  o.shared_prefix.seed = o.seed;
  o.sessions.sessions = absl::GetFlag(FLAGS_sessions);
  o.sessions.turns = absl::GetFlag(FLAGS_turns);
  o.sessions.first_tokens = absl::GetFlag(FLAGS_first_tokens);
  o.sessions.turn_tokens = absl::GetFlag(FLAGS_turn_tokens);
  o.sessions.output_tokens = absl::GetFlag(FLAGS_output_tokens);
  o.sessions.think_s = absl::GetFlag(FLAGS_think_s);
  o.sessions.seed = o.seed;
  o.trace.path = absl::GetFlag(FLAGS_trace);
  o.trace.time_scale = absl::GetFlag(FLAGS_time_scale);
  o.trace.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  o.trace.max_context = absl::GetFlag(FLAGS_max_context);
  o.trace.max_output = absl::GetFlag(FLAGS_max_output);
  o.trace.limit = absl::GetFlag(FLAGS_limit);
  o.trace.seed = o.seed;
  o.tokens.token_base = static_cast<ferry::TokenId>(absl::GetFlag(FLAGS_token_base));
  o.tokens.token_range = static_cast<ferry::TokenId>(absl::GetFlag(FLAGS_token_range));
  o.tokenizer = absl::GetFlag(FLAGS_tokenizer);
  if (o.tokenizer.empty()) {
    if (const char* gguf = std::getenv("FERRY_MODEL_GGUF"); gguf != nullptr) o.tokenizer = gguf;
  }

  o.gpus = absl::GetFlag(FLAGS_gpus);
  o.admin_url = absl::GetFlag(FLAGS_admin_url);
  o.slo.ttft_s = absl::GetFlag(FLAGS_slo_ttft_ms) / 1e3;
  o.slo.tpot_s = absl::GetFlag(FLAGS_slo_tpot_ms) / 1e3;
  o.prices.hit_per_million = absl::GetFlag(FLAGS_price_hit);
  o.prices.miss_per_million = absl::GetFlag(FLAGS_price_miss);
  o.prices.output_per_million = absl::GetFlag(FLAGS_price_output);
  o.prices.currency = absl::GetFlag(FLAGS_currency);
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
  absl::SetProgramUsageMessage("load on a Ferry router; see tools/load/load_main.cc");
  // --help lists this file's flags (absl looks for a file named after the binary by default).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "tools/load/load_main.cc");
  };
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);
  RaiseOpenFileLimit();
  if (absl::Status s = ferry::RunLoadTool(OptionsFromFlags(), stdout); !s.ok()) {
    std::fprintf(stderr, "ferry-load: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
