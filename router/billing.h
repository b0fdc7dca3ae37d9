// What the router bills (ARCHITECTURE.md §9; the seeds' figure of merit, revenue per GPU-hour):
// tokens by class per tenant and model, cache-hit input ("cached_input"), cache-miss input
// ("input") and output, priced per million tokens of each class, over the GPU time of the pool
// (the workers up, times the GPUs each one holds, integrated over time).
//
//   ferry_router_billable_tokens_total{tenant,model,class}   the tokens clients were told of
//   ferry_router_revenue_dollars_total                       the tokens at the configured prices
//   ferry_router_gpu_seconds_total                           the pool's GPU time so far
//   ferry_router_revenue_per_gpu_hour                        revenue over GPU-hours
//
// Report() is the same as JSON (the admin port's /billing), every figure from one snapshot.
// The gauges are refreshed on every Record, WorkersUp and Report.
//
// Thread-safe.

#ifndef FERRY_ROUTER_BILLING_H_
#define FERRY_ROUTER_BILLING_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/clock.h"
#include "nlohmann/json.hpp"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace ferry {

struct Prices {  // dollars per million tokens
  double input = 0;
  double cached_input = 0;
  double output = 0;
};

class Billing {
 public:
  Billing(Prices prices, double gpus_per_worker, Clock* clock, prometheus::Registry& registry);

  // One answered request's usage, as its client was told it.
  void Record(const std::string& tenant, const std::string& model, int64_t prompt_tokens,
              int64_t cached_tokens, int64_t completion_tokens);
  // The pool now has `up` workers (GPU time accrues at up * gpus_per_worker from now on).
  void WorkersUp(int64_t up);

  nlohmann::ordered_json Report();

 private:
  struct Tokens {
    int64_t input = 0, cached_input = 0, output = 0;
  };
  double Revenue(const Tokens& t) const;
  // Under mu_: GPU time to now, and the gauges.
  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Prices prices_;
  const double gpus_per_worker_;
  Clock* const clock_;
  prometheus::Family<prometheus::Counter>* tokens_family_;
  prometheus::Counter* revenue_;
  prometheus::Counter* gpu_seconds_;
  prometheus::Gauge* per_gpu_hour_;

  absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, Tokens> by_tenant_model_ ABSL_GUARDED_BY(mu_);
  double revenue_total_ ABSL_GUARDED_BY(mu_) = 0;
  double gpu_hours_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t up_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration since_;
};

}  // namespace ferry

#endif  // FERRY_ROUTER_BILLING_H_
