#include "tools/load/load_report.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ferry {
namespace {

Percentiles Describe(std::vector<double> values) {
  Percentiles p;
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  double sum = 0;
  for (double v : values) sum += v;
  p.mean = sum / static_cast<double>(values.size());
  p.p50 = Percentile(values, 0.50);
  p.p90 = Percentile(values, 0.90);
  p.p99 = Percentile(values, 0.99);
  p.max = values.back();
  return p;
}

nlohmann::json Millis(const Percentiles& p) {
  return {{"mean", p.mean * 1e3},
          {"p50", p.p50 * 1e3},
          {"p90", p.p90 * 1e3},
          {"p99", p.p99 * 1e3},
          {"max", p.max * 1e3}};
}

double Ratio(double a, double b) { return b > 0 ? a / b : 0; }

}  // namespace

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  if (!std::is_sorted(values.begin(), values.end())) std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

double Tpot(const RequestRecord& record) {
  if (record.output_tokens <= 1) return 0;
  return (record.e2e_s - record.ttft_s) / static_cast<double>(record.output_tokens - 1);
}

bool WithinSlo(const RequestRecord& record, const Slo& slo) {
  if (!record.ok) return false;
  if (slo.ttft_s > 0 && record.ttft_s > slo.ttft_s) return false;
  if (slo.tpot_s > 0 && Tpot(record) > slo.tpot_s) return false;
  return true;
}

double Revenue(const RequestRecord& record, const Prices& prices) {
  if (!record.ok) return 0;
  const double hit = static_cast<double>(record.cached_tokens);
  const double miss = static_cast<double>(record.prompt_tokens - record.cached_tokens);
  const double output = static_cast<double>(record.output_tokens);
  return (hit * prices.hit_per_million + miss * prices.miss_per_million +
          output * prices.output_per_million) /
         1e6;
}

RunSummary Summarize(const std::vector<RequestRecord>& records, const Slo& slo,
                     const Prices& prices, int gpus, double duration_s) {
  RunSummary s;
  s.requests = static_cast<int64_t>(records.size());
  s.gpus = gpus;
  std::vector<double> ttft, itl, tpot, e2e;
  double first = std::numeric_limits<double>::infinity(), last = 0;
  int64_t known_prompt = 0;
  double queued_sum = 0;
  for (const RequestRecord& r : records) {
    first = std::min(first, r.start_s);
    last = std::max(last, r.start_s + r.e2e_s);
    if (r.queued_s > 0) {
      ++s.queued;
      queued_sum += r.queued_s;
      s.queued_max_s = std::max(s.queued_max_s, r.queued_s);
    }
    if (!r.ok) {
      ++s.failed;
      continue;
    }
    ++s.ok;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    if (r.output_tokens > 1) tpot.push_back(Tpot(r));
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    s.prompt_tokens += r.prompt_tokens;
    s.cached_tokens += r.cached_tokens;
    s.output_tokens += r.output_tokens;
    if (r.store_tokens >= 0) {
      ++s.store_known;
      s.store_tokens += r.store_tokens;
      known_prompt += r.prompt_tokens;
      s.memory_hit_ratio += static_cast<double>(r.cached_tokens - r.store_tokens);
    }
    const double revenue = Revenue(r, prices);
    s.revenue += revenue;
    if (WithinSlo(r, slo)) {
      ++s.within_slo;
      s.revenue_within_slo += revenue;
    }
  }
  s.duration_s = duration_s > 0 ? duration_s : (records.empty() ? 0 : last - first);
  s.ttft_s = Describe(ttft);
  s.itl_s = Describe(itl);
  s.tpot_s = Describe(tpot);
  s.e2e_s = Describe(e2e);
  s.request_throughput = Ratio(static_cast<double>(s.ok), s.duration_s);
  s.output_token_throughput = Ratio(static_cast<double>(s.output_tokens), s.duration_s);
  s.goodput = Ratio(static_cast<double>(s.within_slo), s.duration_s);
  s.hit_ratio = Ratio(static_cast<double>(s.cached_tokens), static_cast<double>(s.prompt_tokens));
  s.memory_hit_ratio = Ratio(s.memory_hit_ratio, static_cast<double>(known_prompt));
  s.store_hit_ratio = Ratio(static_cast<double>(s.store_tokens), static_cast<double>(known_prompt));
  s.queued_mean_s = s.queued > 0 ? queued_sum / static_cast<double>(s.queued) : 0;
  s.gpu_hours = static_cast<double>(gpus) * s.duration_s / 3600.0;
  s.revenue_per_gpu_hour = Ratio(s.revenue, s.gpu_hours);
  s.revenue_per_gpu_hour_within_slo = Ratio(s.revenue_within_slo, s.gpu_hours);
  return s;
}

nlohmann::json SummaryJson(const RunSummary& s, const Prices& prices) {
  nlohmann::json j;
  j["requests"] = s.requests;
  j["ok"] = s.ok;
  j["failed"] = s.failed;
  j["within_slo"] = s.within_slo;
  j["duration_s"] = s.duration_s;
  j["ttft_ms"] = Millis(s.ttft_s);
  j["itl_ms"] = Millis(s.itl_s);
  j["tpot_ms"] = Millis(s.tpot_s);
  j["e2e_ms"] = Millis(s.e2e_s);
  j["request_throughput"] = s.request_throughput;
  j["output_token_throughput"] = s.output_token_throughput;
  j["goodput"] = s.goodput;
  j["prompt_tokens"] = s.prompt_tokens;
  j["cached_tokens"] = s.cached_tokens;
  j["output_tokens"] = s.output_tokens;
  j["hit_ratio"] = s.hit_ratio;
  if (s.store_known > 0) {
    j["store_tokens"] = s.store_tokens;
    j["memory_hit_ratio"] = s.memory_hit_ratio;
    j["store_hit_ratio"] = s.store_hit_ratio;
  } else {  // the client cannot tell memory from store
    j["store_tokens"] = nullptr;
    j["memory_hit_ratio"] = nullptr;
    j["store_hit_ratio"] = nullptr;
  }
  j["queued"] = s.queued;
  j["queued_mean_s"] = s.queued_mean_s;
  j["queued_max_s"] = s.queued_max_s;
  nlohmann::json e;
  e["currency"] = prices.currency;
  e["prices_per_million"] = {{"hit", prices.hit_per_million},
                             {"miss", prices.miss_per_million},
                             {"output", prices.output_per_million}};
  e["billable_tokens"] = {{"hit", s.cached_tokens},
                          {"miss", s.prompt_tokens - s.cached_tokens},
                          {"output", s.output_tokens}};
  e["gpus"] = s.gpus;
  e["gpu_hours"] = s.gpu_hours;
  e["revenue"] = s.revenue;
  e["revenue_within_slo"] = s.revenue_within_slo;
  e["revenue_per_gpu_hour"] = s.revenue_per_gpu_hour;
  e["revenue_per_gpu_hour_within_slo"] = s.revenue_per_gpu_hour_within_slo;
  j["economics"] = std::move(e);
  return j;
}

std::string SummaryTable(const RunSummary& s, const Prices& prices) {
  std::string out = absl::StrFormat(
      "requests %d: ok %d, failed %d, within SLO %d; %.2f s from the first send to the last "
      "end\n",
      s.requests, s.ok, s.failed, s.within_slo, s.duration_s);
  absl::StrAppendFormat(&out, "%-10s %10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90", "p99",
                        "max");
  for (const auto& [name, p] : {std::pair<const char*, const Percentiles*>{"TTFT", &s.ttft_s},
                                {"ITL", &s.itl_s},
                                {"TPOT", &s.tpot_s},
                                {"e2e", &s.e2e_s}}) {
    absl::StrAppendFormat(&out, "%-10s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, p->mean * 1e3,
                          p->p50 * 1e3, p->p90 * 1e3, p->p99 * 1e3, p->max * 1e3);
  }
  absl::StrAppendFormat(&out,
                        "throughput %.2f req/s, %.1f output tok/s; goodput %.2f req/s within SLO\n",
                        s.request_throughput, s.output_token_throughput, s.goodput);
  absl::StrAppendFormat(&out, "tokens: prompt %d (cached %d: %.1f%%", s.prompt_tokens,
                        s.cached_tokens, s.hit_ratio * 100);
  if (s.store_known > 0) {
    absl::StrAppendFormat(&out, "; memory %.1f%%, store %.1f%%", s.memory_hit_ratio * 100,
                          s.store_hit_ratio * 100);
  }
  absl::StrAppendFormat(&out, "), output %d\n", s.output_tokens);
  if (s.queued > 0) {
    absl::StrAppendFormat(&out, "waited for a client slot: %d requests, mean %.3f s, max %.3f s\n",
                          s.queued, s.queued_mean_s, s.queued_max_s);
  }
  const std::string& c = prices.currency;
  absl::StrAppendFormat(&out,
                        "billable tokens: hit %d, miss %d, output %d at %g / %g / %g %s per "
                        "million -> revenue %.6f %s (within SLO %.6f)\n",
                        s.cached_tokens, s.prompt_tokens - s.cached_tokens, s.output_tokens,
                        prices.hit_per_million, prices.miss_per_million, prices.output_per_million,
                        c, s.revenue, c, s.revenue_within_slo);
  absl::StrAppendFormat(&out,
                        "GPU-hours %.6f (%d GPUs x %.2f s) -> %.3f %s per GPU-hour (within SLO "
                        "%.3f)\n",
                        s.gpu_hours, s.gpus, s.duration_s, s.revenue_per_gpu_hour, c,
                        s.revenue_per_gpu_hour_within_slo);
  return out;
}

}  // namespace ferry
