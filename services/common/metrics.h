// Prometheus plumbing shared by every service: a registry that already carries the process's
// identity (ferry_build_info), and the histogram buckets Ferry uses for latencies, so that
// dashboards can aggregate the same metric across services. The registry is served by
// AdminServer at /metrics.
//
// Metric names start with "ferry_" (ARCHITECTURE.md §9).

#ifndef FERRY_SERVICES_COMMON_METRICS_H_
#define FERRY_SERVICES_COMMON_METRICS_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ferry {

// Version string of this build ("dev" unless the build stamps one).
absl::string_view FerryVersion();

// A registry with ferry_build_info{service, version} = 1 and
// ferry_process_start_time_seconds{service}.
std::shared_ptr<prometheus::Registry> NewServiceRegistry(absl::string_view service);

// Latency buckets in seconds, 0.5 ms .. 120 s, roughly x2 apart: wide enough for a decode step
// and a long prefill alike.
prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds();

}  // namespace ferry

#endif  // FERRY_SERVICES_COMMON_METRICS_H_
