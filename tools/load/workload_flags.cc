#include "tools/load/workload_flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"

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
ABSL_FLAG(double, rate, 0,
          "open loop: requests/s (0: a trace's own times; other workloads need a rate)");
ABSL_FLAG(std::string, arrivals, "poisson",
          "open loop with --rate: poisson (seeded) or constant (gaps of 1/rate)");
ABSL_FLAG(std::string, envelope, "none",
          "open loop: a day's shape over the workload, looped as needed: none or sine (the trough "
          "at the start, the peak at half the period; replaces --rate)");
ABSL_FLAG(double, envelope_period, 3600, "--envelope: the period, seconds");
ABSL_FLAG(double, envelope_ratio, 4, "--envelope: the peak's rate over the trough's");
ABSL_FLAG(double, envelope_peak, 0,
          "--envelope: requests/s at the peak (sessions/s for --workload sessions)");
ABSL_FLAG(double, envelope_duration, 0, "--envelope: seconds of arrivals (0: one period)");
ABSL_FLAG(uint64_t, seed, 1, "the workload's ids and order, and the Poisson arrivals");
ABSL_FLAG(double, slo_ttft_ms, 0, "goodput: TTFT limit, ms (0: none)");
ABSL_FLAG(double, slo_tpot_ms, 0, "goodput: time per output token limit, ms (0: none)");
ABSL_FLAG(double, price_hit, 0.02, "price per million cache-hit input tokens");
ABSL_FLAG(double, price_miss, 1.0, "price per million cache-miss input tokens");
ABSL_FLAG(double, price_output, 4.0, "price per million output tokens");
ABSL_FLAG(std::string, currency, "CNY", "the prices' currency (defaults: DeepSeek off-peak, yuan)");

namespace ferry {

WorkloadOptions WorkloadOptionsFromFlags() {
  WorkloadOptions o;
  o.kind = absl::GetFlag(FLAGS_workload);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.rate = absl::GetFlag(FLAGS_rate);
  o.arrivals = absl::GetFlag(FLAGS_arrivals);
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
  o.envelope.shape = absl::GetFlag(FLAGS_envelope);
  o.envelope.period_s = absl::GetFlag(FLAGS_envelope_period);
  o.envelope.ratio = absl::GetFlag(FLAGS_envelope_ratio);
  o.envelope.peak = absl::GetFlag(FLAGS_envelope_peak);
  o.envelope.duration_s = absl::GetFlag(FLAGS_envelope_duration);
  return o;
}

Slo SloFromFlags() {
  Slo slo;
  slo.ttft_s = absl::GetFlag(FLAGS_slo_ttft_ms) / 1e3;
  slo.tpot_s = absl::GetFlag(FLAGS_slo_tpot_ms) / 1e3;
  return slo;
}

Prices PricesFromFlags() {
  Prices prices;
  prices.hit_per_million = absl::GetFlag(FLAGS_price_hit);
  prices.miss_per_million = absl::GetFlag(FLAGS_price_miss);
  prices.output_per_million = absl::GetFlag(FLAGS_price_output);
  prices.currency = absl::GetFlag(FLAGS_currency);
  return prices;
}

}  // namespace ferry
