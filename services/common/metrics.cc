#include "services/common/metrics.h"

#include "absl/time/clock.h"
#include "prometheus/gauge.h"

namespace ferry {

absl::string_view FerryVersion() {
#ifdef FERRY_VERSION
  return FERRY_VERSION;
#else
  return "dev";
#endif
}

std::shared_ptr<prometheus::Registry> NewServiceRegistry(absl::string_view service) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("ferry_build_info")
      .Help("Always 1; labels name the service and the Ferry version.")
      .Register(*registry)
      .Add({{"service", std::string(service)}, {"version", std::string(FerryVersion())}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("ferry_process_start_time_seconds")
      .Help("Start time of the process, Unix epoch seconds.")
      .Register(*registry)
      .Add({{"service", std::string(service)}})
      .Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return registry;
}

prometheus::Histogram::BucketBoundaries LatencyBucketsSeconds() {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double b = 0.0005; b <= 120.0; b *= 2) buckets.push_back(b);
  return buckets;
}

}  // namespace ferry
