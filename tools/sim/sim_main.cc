// ferry-sim: one set-up of the discrete-event simulator (tools/sim/sim_run.h) on one workload,
// reported as the load tool reports a real run: a table, then one JSON line.
//
//   ferry-sim --calibration deploy/sim/h200-llama3-8b.json --prefill 16 --decode 16 --store \
//       --workload shared_prefix --groups 32 --system_tokens 16384 --concurrency 512

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/common/log.h"
#include "tools/sim/sim_run.h"

ABSL_FLAG(std::string, calibration, "", "the timing model's calibration file (required)");
ABSL_FLAG(int, aggregated, 0, "aggregated workers");
ABSL_FLAG(int, prefill, 0, "prefill workers (with --decode)");
ABSL_FLAG(int, decode, 0, "decode workers (with --prefill)");
ABSL_FLAG(std::string, policy, "prefix_aware", "round_robin | least_loaded | prefix_aware");
ABSL_FLAG(std::string, speeds, "", "compute speed per worker, comma-separated (missing: 1)");
ABSL_FLAG(bool, store, false, "a shared KV store in the request path");
ABSL_FLAG(double, store_gib, 4096, "the store's capacity, GiB of the calibrated model's KV");
ABSL_FLAG(double, kv_pool_gib, 16, "each worker's KV pool, GiB of the calibrated model's KV");
ABSL_FLAG(int, block_tokens, 64, "KV block size");
ABSL_FLAG(int64_t, max_batch_tokens, 8192, "tokens per engine step");
ABSL_FLAG(int64_t, prefill_chunk, 8192, "prompt tokens per sequence per step");
ABSL_FLAG(int64_t, max_running, 128, "sequences with KV per worker");
ABSL_FLAG(int64_t, max_queued, 256, "requests waiting per worker");
ABSL_FLAG(std::string, workload, "shared_prefix", "shared_prefix | sessions | trace");
ABSL_FLAG(int64_t, groups, 32, "shared_prefix: groups");
ABSL_FLAG(int64_t, prompts_per_group, 64, "shared_prefix: prompts per group");
ABSL_FLAG(int64_t, system_tokens, 16384, "shared_prefix: the group's system prompt");
ABSL_FLAG(int64_t, question_tokens, 256, "shared_prefix: each prompt's own question");
ABSL_FLAG(int64_t, output_tokens, 256, "shared_prefix / sessions: output tokens");
ABSL_FLAG(int64_t, sessions, 64, "sessions: sessions");
ABSL_FLAG(int64_t, turns, 8, "sessions: turns per session");
ABSL_FLAG(int64_t, first_tokens, 8192, "sessions: the first turn's prompt");
ABSL_FLAG(int64_t, turn_tokens, 512, "sessions: new tokens per turn");
ABSL_FLAG(std::string, trace, "", "trace: a Mooncake-format JSON-lines file");
ABSL_FLAG(double, time_scale, 1.0, "trace: arrival times x this");
ABSL_FLAG(int64_t, trace_block_tokens, 512, "trace: tokens one hash id becomes");
ABSL_FLAG(int64_t, max_context, 131072, "trace: longer requests are dropped");
ABSL_FLAG(int64_t, limit, 0, "trace: the first N requests only (0: all)");
ABSL_FLAG(std::string, mode, "closed", "closed | open");
ABSL_FLAG(int64_t, concurrency, 256, "closed loop: clients");
ABSL_FLAG(double, rate, 0, "open loop: Poisson requests/s (0: the trace's own times)");
ABSL_FLAG(double, slo_ttft_ms, 2000, "SLO: time to first token (0: none)");
ABSL_FLAG(double, slo_tpot_ms, 100, "SLO: time per output token (0: none)");
ABSL_FLAG(double, price_hit, 0.02, "price per million cache-hit input tokens");
ABSL_FLAG(double, price_miss, 1.0, "price per million cache-miss input tokens");
ABSL_FLAG(double, price_output, 4.0, "price per million output tokens");
ABSL_FLAG(std::string, currency, "CNY", "the prices' currency");
ABSL_FLAG(uint64_t, seed, 1, "workload and policy seed");

namespace ferry {
namespace {

int Main() {
  auto calibration = LoadSimCalibration(absl::GetFlag(FLAGS_calibration));
  if (!calibration.ok()) {
    std::fprintf(stderr, "ferry-sim: %s\n", calibration.status().ToString().c_str());
    return 2;
  }
  ClusterOptions c;
  c.policy = absl::GetFlag(FLAGS_policy);
  c.aggregated = absl::GetFlag(FLAGS_aggregated);
  c.prefill = absl::GetFlag(FLAGS_prefill);
  c.decode = absl::GetFlag(FLAGS_decode);
  c.calibration = *calibration;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_speeds), ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(s, &v) || !(v > 0)) {
      std::fprintf(stderr, "ferry-sim: --speeds: bad value '%s'\n", std::string(s).c_str());
      return 2;
    }
    c.speeds.push_back(v);
  }
  c.store = absl::GetFlag(FLAGS_store);
  c.store_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_store_gib) * (1 << 30));
  c.worker.kv_pool_bytes = static_cast<int64_t>(absl::GetFlag(FLAGS_kv_pool_gib) * (1 << 30));
  c.worker.block_tokens = absl::GetFlag(FLAGS_block_tokens);
  c.worker.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  c.worker.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  c.worker.max_running = absl::GetFlag(FLAGS_max_running);
  c.worker.max_queued = absl::GetFlag(FLAGS_max_queued);
  c.seed = absl::GetFlag(FLAGS_seed);
  // The simulated model's vocabulary is small (sampling costs CPU per row); the workload's ids
  // must lie in it.
  TokenSpace space;
  space.token_base = 1;
  space.token_range = static_cast<TokenId>(c.worker.vocab_size - 1);
  Workload workload;
  const std::string kind = absl::GetFlag(FLAGS_workload);
  if (kind == "shared_prefix") {
    SharedPrefixSpec s;
    s.groups = absl::GetFlag(FLAGS_groups);
    s.prompts_per_group = absl::GetFlag(FLAGS_prompts_per_group);
    s.system_tokens = absl::GetFlag(FLAGS_system_tokens);
    s.question_tokens = absl::GetFlag(FLAGS_question_tokens);
    s.output_tokens = absl::GetFlag(FLAGS_output_tokens);
    s.seed = absl::GetFlag(FLAGS_seed);
    workload = MakeSharedPrefix(s, space);
  } else if (kind == "sessions") {
    SessionSpec s;
    s.sessions = absl::GetFlag(FLAGS_sessions);
    s.turns = absl::GetFlag(FLAGS_turns);
    s.first_tokens = absl::GetFlag(FLAGS_first_tokens);
    s.turn_tokens = absl::GetFlag(FLAGS_turn_tokens);
    s.output_tokens = absl::GetFlag(FLAGS_output_tokens);
    s.seed = absl::GetFlag(FLAGS_seed);
    workload = MakeSessions(s, space);
  } else if (kind == "trace") {
    TraceSpec s;
    s.path = absl::GetFlag(FLAGS_trace);
    s.time_scale = absl::GetFlag(FLAGS_time_scale);
    s.block_tokens = absl::GetFlag(FLAGS_trace_block_tokens);
    s.max_context = absl::GetFlag(FLAGS_max_context);
    s.limit = absl::GetFlag(FLAGS_limit);
    auto trace = LoadTrace(s, space);
    if (!trace.ok()) {
      std::fprintf(stderr, "ferry-sim: %s\n", trace.status().ToString().c_str());
      return 2;
    }
    workload = *std::move(trace);
  } else {
    std::fprintf(stderr, "ferry-sim: --workload must be shared_prefix, sessions or trace\n");
    return 2;
  }
  SimRunOptions run;
  run.mode = absl::GetFlag(FLAGS_mode);
  run.concurrency = absl::GetFlag(FLAGS_concurrency);
  if (run.mode == "open" && absl::GetFlag(FLAGS_rate) > 0) {
    SetPoissonArrivals(&workload, absl::GetFlag(FLAGS_rate), absl::GetFlag(FLAGS_seed));
  }
  run.slo.ttft_s = absl::GetFlag(FLAGS_slo_ttft_ms) / 1e3;
  run.slo.tpot_s = absl::GetFlag(FLAGS_slo_tpot_ms) / 1e3;
  run.prices.hit_per_million = absl::GetFlag(FLAGS_price_hit);
  run.prices.miss_per_million = absl::GetFlag(FLAGS_price_miss);
  run.prices.output_per_million = absl::GetFlag(FLAGS_price_output);
  run.prices.currency = absl::GetFlag(FLAGS_currency);
  auto result = RunSimulation(c, workload, run);
  if (!result.ok()) {
    std::fprintf(stderr, "ferry-sim: %s\n", result.status().ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "%s: %zu requests (%s)\n", workload.kind.c_str(), workload.requests.size(),
               workload.note.c_str());
  std::fprintf(stderr, "%s", SummaryTable(result->summary, run.prices).c_str());
  std::fprintf(stderr, "simulated %.1f s in %.1f s of CPU (%lld events)\n", result->sim_seconds,
               result->wall_seconds, static_cast<long long>(result->events));
  std::printf("%s\n", SimRunJson(*result, run).dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ferry-sim: the discrete-event simulator on one set-up");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_calibration).empty()) {
    std::fprintf(stderr, "ferry-sim: --calibration FILE is required\n");
    return 2;
  }
  return ferry::Main();
}
