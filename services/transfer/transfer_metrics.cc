#include "services/transfer/transfer_metrics.h"

#include "absl/strings/ascii.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ferry {
namespace transfer {

namespace {

// 10 us .. ~84 s, x2 apart: a shared-memory block copy and a multi-GiB transfer over tcp alike.
prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  prometheus::Histogram::BucketBoundaries buckets;
  for (double b = 1e-5; b < 100; b *= 2) buckets.push_back(b);
  return buckets;
}

}  // namespace

std::string StatusCodeLabel(absl::StatusCode code) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

TransferMetrics::TransferMetrics(prometheus::Registry* registry) {
  if (registry == nullptr) return;
  bytes_ = &prometheus::BuildCounter()
                .Name("ferry_kv_transfer_bytes_total")
                .Help("Bytes moved by KV transfers that succeeded.")
                .Register(*registry);
  transfers_ = &prometheus::BuildCounter()
                    .Name("ferry_kv_transfers_total")
                    .Help("KV transfers finished, any outcome.")
                    .Register(*registry);
  failures_ = &prometheus::BuildCounter()
                   .Name("ferry_kv_transfer_failures_total")
                   .Help("KV transfers that failed, by status code.")
                   .Register(*registry);
  seconds_ = &prometheus::BuildHistogram()
                  .Name("ferry_kv_transfer_seconds")
                  .Help("KV transfer latency, from Post to completion.")
                  .Register(*registry);
  regions_ = &prometheus::BuildGauge()
                  .Name("ferry_kv_transfer_registered_regions")
                  .Help("Memory regions registered with the KV transport.")
                  .Register(*registry);
  region_bytes_ = &prometheus::BuildGauge()
                       .Name("ferry_kv_transfer_registered_bytes")
                       .Help("Bytes of memory registered with the KV transport.")
                       .Register(*registry);
  notifications_ = &prometheus::BuildCounter()
                        .Name("ferry_kv_transfer_notifications_total")
                        .Help("Transfer outcomes awaited by the owner of the memory, by outcome.")
                        .Register(*registry);
}

void TransferMetrics::RecordTransfer(absl::string_view transport, TransferOp op, uint64_t bytes,
                                     absl::Duration latency, const absl::Status& status) {
  if (transfers_ == nullptr) return;
  const std::map<std::string, std::string> labels = {{"transport", std::string(transport)},
                                                     {"op", std::string(TransferOpName(op))}};
  transfers_->Add(labels).Increment();
  seconds_->Add(labels, SecondsBuckets()).Observe(absl::ToDoubleSeconds(latency));
  if (status.ok()) {
    bytes_->Add(labels).Increment(static_cast<double>(bytes));
  } else {
    auto failure_labels = labels;
    failure_labels["code"] = StatusCodeLabel(status.code());
    failures_->Add(failure_labels).Increment();
  }
}

void TransferMetrics::RecordNotification(absl::string_view transport, const absl::Status& status) {
  if (notifications_ == nullptr) return;
  const std::string outcome = status.ok() ? "ok"
                              : status.code() == absl::StatusCode::kDeadlineExceeded
                                  ? "deadline_exceeded"
                                  : "failed";
  notifications_->Add({{"transport", std::string(transport)}, {"outcome", outcome}}).Increment();
}

void TransferMetrics::SetRegistered(absl::string_view kind, int64_t regions, uint64_t bytes) {
  if (regions_ == nullptr) return;
  regions_->Add({{"transport", std::string(kind)}}).Set(static_cast<double>(regions));
  region_bytes_->Add({{"transport", std::string(kind)}}).Set(static_cast<double>(bytes));
}

}  // namespace transfer
}  // namespace ferry
