// What a load run measured, summarised the same way by the load tool (ferry-load, against a real
// stack) and the discrete-event simulator (tools/sim): per-request records in, percentiles,
// throughput, cache hits, goodput under SLOs and the economics out, as a table for people and
// a JSON object for machines.
//
// Economics: billable tokens by class (input read from a cache, memory or store: "hit"; input
// computed: "miss"; output), the revenue they earn at `Prices`, GPU-hours (GPUs x the run's
// duration) and revenue per GPU-hour, for all requests and for those within the SLOs (goodput:
// a request counts when its TTFT and its TPOT are within the limits; a failed one never does).
// The default prices are the off-peak DeepSeek API prices the seeds use, in yuan (CNY) per
// million tokens: 0.02 hit, 1 miss, 4 output.
//
// Thread-compatible values.

#ifndef FERRY_TOOLS_LOAD_LOAD_REPORT_H_
#define FERRY_TOOLS_LOAD_LOAD_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace ferry {

// One request as the client saw it.
struct RequestRecord {
  int64_t id = 0;
  bool ok = false;
  std::string error;          // when !ok
  double start_s = 0;         // sent, seconds after the run's start
  double ttft_s = 0;          // first token after start
  double e2e_s = 0;           // last byte after start
  std::vector<double> itl_s;  // gaps between successive token events
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;  // from usage: prompt tokens read from a cache (memory or store)
  int64_t store_tokens = -1;  // of those, from the KV store (-1: not known; the simulator knows)
  // Open loop: seconds it waited past its arrival time for a slot under the client's bound on
  // requests in flight (start_s is when it was sent, after the wait; TTFT does not include it).
  double queued_s = 0;
};

struct Slo {
  double ttft_s = 0;  // 0: no limit
  double tpot_s = 0;  // time per output token after the first; 0: no limit
};

struct Prices {
  std::string currency = "CNY";
  double hit_per_million = 0.02;
  double miss_per_million = 1.0;
  double output_per_million = 4.0;
};

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct RunSummary {
  int64_t requests = 0, ok = 0, failed = 0, within_slo = 0;
  double duration_s = 0;  // first send to last end
  Percentiles ttft_s, itl_s, tpot_s, e2e_s;
  double request_throughput = 0;       // ok requests / s
  double output_token_throughput = 0;  // output tokens / s
  double goodput = 0;                  // requests within SLO / s
  int64_t prompt_tokens = 0, cached_tokens = 0, store_tokens = 0, output_tokens = 0;
  int64_t store_known = 0;      // ok requests whose store part is known (store_tokens >= 0)
  double hit_ratio = 0;         // cached / prompt tokens
  double memory_hit_ratio = 0;  // (cached - store) / prompt, where the store's part is known
  double store_hit_ratio = 0;
  // Requests that waited for a slot (queued_s > 0), and how long (mean over those, max).
  int64_t queued = 0;
  double queued_mean_s = 0, queued_max_s = 0;
  // Economics.
  int gpus = 0;
  double gpu_hours = 0;
  double revenue = 0, revenue_within_slo = 0;
  double revenue_per_gpu_hour = 0, revenue_per_gpu_hour_within_slo = 0;
};

// TPOT of a record: (e2e - ttft) / (output_tokens - 1); 0 with one token or fewer.
double Tpot(const RequestRecord& record);
bool WithinSlo(const RequestRecord& record, const Slo& slo);
// Revenue of one request at `prices`: cached tokens at the hit price, the rest of the prompt at
// the miss price, output at the output price. A failed request is not billed (0).
double Revenue(const RequestRecord& record, const Prices& prices);
// Linear interpolation between closest ranks (NumPy's default): p in [0, 1].
double Percentile(std::vector<double> values, double p);

// `duration_s` <= 0: from the records (first start to last end). `gpus`: accelerators the
// served system used during the run. TTFT, TPOT and e2e percentiles are over the ok requests
// (TPOT: those with two output tokens or more), ITL over every gap of every ok request; token
// counts, the hit ratios and revenue over the ok requests.
RunSummary Summarize(const std::vector<RequestRecord>& records, const Slo& slo,
                     const Prices& prices, int gpus, double duration_s = 0);
nlohmann::json SummaryJson(const RunSummary& summary, const Prices& prices);
// A few lines for people (percentiles in ms).
std::string SummaryTable(const RunSummary& summary, const Prices& prices);

}  // namespace ferry

#endif  // FERRY_TOOLS_LOAD_LOAD_REPORT_H_
