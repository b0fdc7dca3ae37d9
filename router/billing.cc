#include "router/billing.h"

namespace ferry {

Billing::Billing(Prices prices, double gpus_per_worker, Clock* clock,
                 prometheus::Registry& registry)
    : prices_(prices), gpus_per_worker_(gpus_per_worker), clock_(clock) {
  tokens_family_ = &prometheus::BuildCounter()
                        .Name("ferry_router_billable_tokens_total")
                        .Help(
                            "Tokens billed, by tenant, model and class (cached_input, input, "
                            "output).")
                        .Register(registry);
  revenue_ = &prometheus::BuildCounter()
                  .Name("ferry_router_revenue_dollars_total")
                  .Help("The billed tokens at the configured prices per million.")
                  .Register(registry)
                  .Add({});
  gpu_seconds_ = &prometheus::BuildCounter()
                      .Name("ferry_router_gpu_seconds_total")
                      .Help("GPU time of the pool so far: workers up x GPUs per worker.")
                      .Register(registry)
                      .Add({});
  per_gpu_hour_ = &prometheus::BuildGauge()
                       .Name("ferry_router_revenue_per_gpu_hour")
                       .Help("Revenue per GPU-hour: revenue_dollars_total over GPU-hours.")
                       .Register(registry)
                       .Add({});
  since_ = clock_->Monotonic();
}

double Billing::Revenue(const Tokens& t) const {
  return (static_cast<double>(t.input) * prices_.input +
          static_cast<double>(t.cached_input) * prices_.cached_input +
          static_cast<double>(t.output) * prices_.output) /
         1e6;
}

void Billing::Advance() {
  const absl::Duration now = clock_->Monotonic();
  const double gpu_seconds =
      static_cast<double>(up_) * gpus_per_worker_ * absl::ToDoubleSeconds(now - since_);
  since_ = now;
  gpu_hours_ += gpu_seconds / 3600;
  gpu_seconds_->Increment(gpu_seconds);
  per_gpu_hour_->Set(gpu_hours_ > 0 ? revenue_total_ / gpu_hours_ : 0);
}

void Billing::Record(const std::string& tenant, const std::string& model, int64_t prompt_tokens,
                     int64_t cached_tokens, int64_t completion_tokens) {
  Tokens t;
  t.cached_input = cached_tokens;
  t.input = prompt_tokens - cached_tokens;
  t.output = completion_tokens;
  const double revenue = Revenue(t);
  tokens_family_->Add({{"tenant", tenant}, {"model", model}, {"class", "input"}})
      .Increment(static_cast<double>(t.input));
  tokens_family_->Add({{"tenant", tenant}, {"model", model}, {"class", "cached_input"}})
      .Increment(static_cast<double>(t.cached_input));
  tokens_family_->Add({{"tenant", tenant}, {"model", model}, {"class", "output"}})
      .Increment(static_cast<double>(t.output));
  revenue_->Increment(revenue);
  absl::MutexLock lock(&mu_);
  Tokens& sum = by_tenant_model_[{tenant, model}];
  sum.input += t.input;
  sum.cached_input += t.cached_input;
  sum.output += t.output;
  revenue_total_ += revenue;
  Advance();
}

void Billing::WorkersUp(int64_t up) {
  absl::MutexLock lock(&mu_);
  Advance();
  up_ = up;
}

nlohmann::ordered_json Billing::Report() {
  absl::MutexLock lock(&mu_);
  Advance();
  nlohmann::ordered_json usage = nlohmann::ordered_json::array();
  for (const auto& [key, t] : by_tenant_model_) {
    usage.push_back({{"tenant", key.first},
                     {"model", key.second},
                     {"input_tokens", t.input},
                     {"cached_input_tokens", t.cached_input},
                     {"output_tokens", t.output},
                     {"revenue_dollars", Revenue(t)}});
  }
  return {{"prices_per_million_tokens",
           {{"input", prices_.input},
            {"cached_input", prices_.cached_input},
            {"output", prices_.output}}},
          {"gpus_per_worker", gpus_per_worker_},
          {"workers_up", up_},
          {"usage", std::move(usage)},
          {"revenue_dollars", revenue_total_},
          {"gpu_hours", gpu_hours_},
          {"revenue_per_gpu_hour", gpu_hours_ > 0 ? revenue_total_ / gpu_hours_ : 0.0}};
}

}  // namespace ferry
