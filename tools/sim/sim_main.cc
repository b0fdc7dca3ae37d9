// ferry-sim: one set-up of the discrete-event simulator (tools/sim/sim_run.h) on one workload,
// reported as the load tool reports a real run: a table, then one JSON line.
//
//   ferry-sim --calibration deploy/sim/h200-llama3-8b.json --prefill 16 --decode 16 --store \
//       --workload shared_prefix --groups 128 --system_tokens 16384 --concurrency 384
//   ferry-sim --calibration deploy/sim/h200-llama3-8b.json --aggregated 32 --workload trace \
//       --trace trace.jsonl --block_tokens 512 --max_context 131072 --mode open
//   ferry-sim --calibration deploy/sim/h200-llama3-8b.json --prefill 2 --decode 2 --store \
//       --workload trace --trace trace.jsonl --mode open --envelope sine --envelope_peak 6 \
//       --envelope_period 1800 --planner --startup 60s --slo_ttft_ms 2000 --slo_tpot_ms 100
//
// With --planner the planner (services/planner) sizes the pools every --planner_interval from
// the cluster's snapshot: new workers start after --startup, removed ones drain with
// --drain_grace and hand their streams off; GPU-hours are then every worker's life.
//
// The workload, SLO and price flags are the load tool's (tools/load/workload_flags.h); the
// workload's ids lie in the simulated model's small vocabulary.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "engine/common/log.h"
#include "services/common/command_line.h"
#include "tools/load/workload_flags.h"
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
ABSL_FLAG(int, kv_block_tokens, 64, "the workers' KV block size, tokens");
ABSL_FLAG(int64_t, max_batch_tokens, 8192, "tokens per engine step");
ABSL_FLAG(int64_t, prefill_chunk, 8192, "prompt tokens per sequence per step");
ABSL_FLAG(int64_t, max_running, 128, "sequences with KV per worker");
ABSL_FLAG(int64_t, max_queued, 256, "requests waiting per worker");
ABSL_FLAG(std::string, mode, "closed", "closed (--concurrency clients) or open (--rate, a trace)");
ABSL_FLAG(uint64_t, policy_seed, 1, "the routing policy's random ties");
ABSL_FLAG(int64_t, concurrency, 256, "closed loop: clients");
ABSL_FLAG(absl::Duration, drain_grace, absl::Seconds(30),
          "a drained worker's requests run on this long, then are handed off with their KV");
ABSL_FLAG(bool, planner, false, "the planner sizes the pools at run time");
ABSL_FLAG(absl::Duration, planner_interval, absl::Seconds(10), "--planner: how often it decides");
ABSL_FLAG(absl::Duration, startup, absl::Seconds(60),
          "--planner: a new worker's start-up time (simulated, and the planner's first guess)");
ABSL_FLAG(absl::Duration, cooldown, absl::Seconds(60),
          "--planner: no scale-in of a pool this long after it was scaled");
ABSL_FLAG(double, target_utilisation, 0.7, "--planner: a pool's utilisation at the forecast load");
ABSL_FLAG(double, scale_in_max_utilisation, 0.8,
          "--planner: no scale-in while a pool's utilisation is above this");
ABSL_FLAG(int64_t, min_prefill, 1, "--planner: the prefill pool's floor");
ABSL_FLAG(int64_t, max_prefill, 64, "--planner: the prefill pool's ceiling");
ABSL_FLAG(int64_t, min_decode, 1, "--planner: the decode pool's floor");
ABSL_FLAG(int64_t, max_decode, 64, "--planner: the decode pool's ceiling");
ABSL_FLAG(int64_t, min_aggregated, 1, "--planner: the aggregated pool's floor");
ABSL_FLAG(int64_t, max_aggregated, 64, "--planner: the aggregated pool's ceiling");

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
  c.worker.block_tokens = absl::GetFlag(FLAGS_kv_block_tokens);
  c.worker.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  c.worker.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  c.worker.max_running = absl::GetFlag(FLAGS_max_running);
  c.worker.max_queued = absl::GetFlag(FLAGS_max_queued);
  c.seed = absl::GetFlag(FLAGS_policy_seed);
  c.drain_grace_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_drain_grace));
  // The simulated model's vocabulary is small (sampling costs CPU per row); the workload's ids
  // must lie in it.
  WorkloadOptions w = WorkloadOptionsFromFlags();
  w.tokens.token_base = 1;
  w.tokens.token_range = static_cast<TokenId>(c.worker.vocab_size - 1);
  SimRunOptions run;
  run.mode = absl::GetFlag(FLAGS_mode);
  auto made = MakeWorkload(w, run.mode == "open");
  if (!made.ok()) {
    std::fprintf(stderr, "ferry-sim: %s\n", std::string(made.status().message()).c_str());
    return 2;
  }
  const Workload workload = *std::move(made);
  run.concurrency = absl::GetFlag(FLAGS_concurrency);
  run.slo = SloFromFlags();
  run.prices = PricesFromFlags();
  run.seed = w.seed;
  run.startup_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_startup));
  if (absl::GetFlag(FLAGS_planner)) {
    PlannerOptions p;
    if (run.slo.ttft_s > 0) p.ttft_target_s = run.slo.ttft_s;
    if (run.slo.tpot_s > 0) p.itl_target_s = run.slo.tpot_s;
    p.interval_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_planner_interval));
    p.startup_s = run.startup_s;
    p.cooldown_s = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_cooldown));
    p.target_utilisation = absl::GetFlag(FLAGS_target_utilisation);
    p.scale_in_max_utilisation = absl::GetFlag(FLAGS_scale_in_max_utilisation);
    const auto limits = [&](PoolRole role, int64_t min, int64_t max) {
      p.limits[static_cast<size_t>(role)].min_replicas = min;
      p.limits[static_cast<size_t>(role)].max_replicas = max;
    };
    limits(PoolRole::kPrefill, absl::GetFlag(FLAGS_min_prefill), absl::GetFlag(FLAGS_max_prefill));
    limits(PoolRole::kDecode, absl::GetFlag(FLAGS_min_decode), absl::GetFlag(FLAGS_max_decode));
    limits(PoolRole::kAggregated, absl::GetFlag(FLAGS_min_aggregated),
           absl::GetFlag(FLAGS_max_aggregated));
    if (absl::Status valid = p.Validate(); !valid.ok()) {
      std::fprintf(stderr, "ferry-sim: %s\n", valid.ToString().c_str());
      return 2;
    }
    run.planner = p;
  }
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
  if (run.planner.has_value()) {
    const PlannerCounts& p = result->planner;
    const ClusterStats& k = result->cluster;
    std::fprintf(stderr,
                 "planner: %lld decisions, %lld scale-outs, %lld scale-ins (%lld blocked by "
                 "utilisation); workers added %lld, drained %lld (%lld streams handed off); "
                 "%.4f GPU-hours over the workers' lives (%.2f GPUs on average)\n",
                 static_cast<long long>(p.decisions), static_cast<long long>(p.scale_out),
                 static_cast<long long>(p.scale_in),
                 static_cast<long long>(p.scale_in_blocked_by_utilisation),
                 static_cast<long long>(k.workers_added), static_cast<long long>(k.workers_drained),
                 static_cast<long long>(k.drain_handoffs), result->gpu_seconds / 3600,
                 result->sim_seconds > 0 ? result->gpu_seconds / result->sim_seconds : 0.0);
  }
  std::printf("%s\n", SimRunJson(*result, run).dump().c_str());
  return 0;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ferry::ParseProgramCommandLine(
      "ferry-sim", "the discrete-event simulator on one set-up (--calibration FILE)", argc, argv);
  if (absl::GetFlag(FLAGS_calibration).empty()) {
    std::fprintf(stderr, "ferry-sim: --calibration FILE is required\n");
    return 2;
  }
  return ferry::Main();
}
