#include "tools/load/load_report.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(PercentileTest, InterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 2.5);    // rank 1.5
  EXPECT_DOUBLE_EQ(Percentile(v, 0.9), 3.7);    // rank 2.7
  EXPECT_DOUBLE_EQ(Percentile(v, 0.99), 3.97);  // rank 2.97
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 1), 4);
  EXPECT_DOUBLE_EQ(Percentile({5}, 0.9), 5);
  EXPECT_DOUBLE_EQ(Percentile({}, 0.5), 0);
}

RequestRecord Ok(double start, double ttft, double e2e, int64_t output, double itl, int64_t prompt,
                 int64_t cached) {
  RequestRecord r;
  r.ok = true;
  r.start_s = start;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  r.output_tokens = output;
  r.itl_s.assign(static_cast<size_t>(output - 1), itl);
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  return r;
}

TEST(LoadReportTest, TpotSloAndRevenueOfOneRequest) {
  const RequestRecord r = Ok(0, 0.1, 1.1, 11, 0.1, 100, 50);
  EXPECT_DOUBLE_EQ(Tpot(r), 0.1);  // (1.1 - 0.1) / 10
  RequestRecord one = r;
  one.output_tokens = 1;
  EXPECT_EQ(Tpot(one), 0);
  EXPECT_TRUE(WithinSlo(r, Slo{}));
  EXPECT_TRUE(WithinSlo(r, Slo{0.1, 0.1}));
  EXPECT_FALSE(WithinSlo(r, Slo{0.09, 0}));
  EXPECT_FALSE(WithinSlo(r, Slo{0, 0.09}));
  RequestRecord failed = r;
  failed.ok = false;
  EXPECT_FALSE(WithinSlo(failed, Slo{}));

  // 1M hit + 1M miss + 1M output tokens at the defaults: 0.02 + 1 + 4 = 5.02 CNY.
  RequestRecord million;
  million.ok = true;
  million.prompt_tokens = 2'000'000;
  million.cached_tokens = 1'000'000;
  million.output_tokens = 1'000'000;
  const Prices prices;
  EXPECT_EQ(prices.currency, "CNY");
  EXPECT_DOUBLE_EQ(Revenue(million, prices), 5.02);
  million.ok = false;
  EXPECT_EQ(Revenue(million, prices), 0);  // a failed request is not billed
}

TEST(LoadReportTest, SummarizesByHand) {
  std::vector<RequestRecord> records;
  records.push_back(Ok(0.0, 0.1, 1.1, 11, 0.1, 100, 50));  // TPOT 0.1, ends 1.1
  records.push_back(Ok(0.5, 0.3, 2.3, 11, 0.2, 100, 0));   // TPOT 0.2, ends 2.8
  records[0].store_tokens = 20;
  records[1].queued_s = 0.4;
  RequestRecord failed;
  failed.start_s = 1.0;
  failed.e2e_s = 0.5;
  failed.error = "HTTP 503";
  failed.prompt_tokens = 100;
  records.push_back(failed);

  const Slo slo{0.2, 0.15};  // the first only
  const RunSummary s = Summarize(records, slo, Prices{}, /*gpus=*/2);
  EXPECT_EQ(s.requests, 3);
  EXPECT_EQ(s.ok, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.within_slo, 1);
  EXPECT_NEAR(s.duration_s, 2.8, 1e-12);
  EXPECT_NEAR(s.ttft_s.mean, 0.2, 1e-12);
  EXPECT_NEAR(s.ttft_s.p50, 0.2, 1e-12);
  EXPECT_NEAR(s.ttft_s.p90, 0.28, 1e-12);
  EXPECT_DOUBLE_EQ(s.ttft_s.max, 0.3);
  EXPECT_NEAR(s.tpot_s.mean, 0.15, 1e-12);
  EXPECT_NEAR(s.itl_s.mean, 0.15, 1e-12);  // ten gaps of 0.1 and ten of 0.2
  EXPECT_NEAR(s.itl_s.p50, 0.15, 1e-12);
  EXPECT_DOUBLE_EQ(s.itl_s.max, 0.2);
  EXPECT_NEAR(s.e2e_s.mean, 1.7, 1e-12);
  EXPECT_NEAR(s.request_throughput, 2 / 2.8, 1e-12);
  EXPECT_NEAR(s.output_token_throughput, 22 / 2.8, 1e-12);
  EXPECT_NEAR(s.goodput, 1 / 2.8, 1e-12);
  EXPECT_EQ(s.prompt_tokens, 200);  // the failed request's are not counted
  EXPECT_EQ(s.cached_tokens, 50);
  EXPECT_EQ(s.output_tokens, 22);
  EXPECT_DOUBLE_EQ(s.hit_ratio, 0.25);
  // The store's part is known for the first only: (50 - 20) / 100 and 20 / 100.
  EXPECT_EQ(s.store_known, 1);
  EXPECT_EQ(s.store_tokens, 20);
  EXPECT_NEAR(s.memory_hit_ratio, 0.3, 1e-12);
  EXPECT_NEAR(s.store_hit_ratio, 0.2, 1e-12);
  EXPECT_EQ(s.queued, 1);
  EXPECT_NEAR(s.queued_mean_s, 0.4, 1e-12);
  // Revenue: 50 x 0.02 + 50 x 1 + 11 x 4 = 95, and 100 x 1 + 11 x 4 = 144 (per million).
  EXPECT_NEAR(s.revenue, 239e-6, 1e-15);
  EXPECT_NEAR(s.revenue_within_slo, 95e-6, 1e-15);
  EXPECT_NEAR(s.gpu_hours, 2 * 2.8 / 3600, 1e-12);
  EXPECT_NEAR(s.revenue_per_gpu_hour, 239e-6 / (5.6 / 3600), 1e-12);
  EXPECT_NEAR(s.revenue_per_gpu_hour_within_slo, 95e-6 / (5.6 / 3600), 1e-12);

  // A duration given wins over the records'.
  EXPECT_DOUBLE_EQ(Summarize(records, slo, Prices{}, 2, 10.0).request_throughput, 0.2);
}

TEST(LoadReportTest, JsonAndTableCarryTheEconomics) {
  std::vector<RequestRecord> records = {Ok(0, 0.1, 1.1, 11, 0.1, 100, 50)};
  Prices prices;
  prices.currency = "USD";
  prices.miss_per_million = 2;
  const RunSummary s = Summarize(records, Slo{}, prices, 1);
  const nlohmann::json j = SummaryJson(s, prices);
  EXPECT_EQ(j["ok"], 1);
  EXPECT_DOUBLE_EQ(j["ttft_ms"]["mean"].get<double>(), 100);
  EXPECT_DOUBLE_EQ(j["tpot_ms"]["p50"].get<double>(), 100);
  const auto& e = j["economics"];
  EXPECT_EQ(e["currency"], "USD");
  EXPECT_EQ(e["billable_tokens"]["hit"], 50);
  EXPECT_EQ(e["billable_tokens"]["miss"], 50);
  EXPECT_EQ(e["billable_tokens"]["output"], 11);
  EXPECT_DOUBLE_EQ(e["prices_per_million"]["miss"].get<double>(), 2);
  EXPECT_NEAR(e["revenue"].get<double>(), (50 * 0.02 + 50 * 2 + 11 * 4) / 1e6, 1e-15);
  EXPECT_EQ(e["gpus"], 1);
  EXPECT_TRUE(j["store_tokens"].is_null());  // nothing known about the store

  const std::string table = SummaryTable(s, prices);
  EXPECT_NE(table.find("TTFT"), std::string::npos);
  EXPECT_NE(table.find("USD per GPU-hour"), std::string::npos) << table;
  EXPECT_NE(table.find("hit 50, miss 50, output 11"), std::string::npos) << table;
}

}  // namespace
}  // namespace ferry
