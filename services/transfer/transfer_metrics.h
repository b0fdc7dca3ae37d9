// The KV transport's Prometheus metrics, the same for every implementation (ARCHITECTURE.md §9:
// transfer bytes and latency):
//
//   ferry_kv_transfer_bytes_total{transport, op}              bytes of transfers that succeeded
//   ferry_kv_transfers_total{transport, op}                   finished transfers, any outcome
//   ferry_kv_transfer_failures_total{transport, op, code}     failed ones, by status code
//                                                             ("deadline_exceeded",
//                                                             "unavailable"...)
//   ferry_kv_transfer_seconds{transport, op}                  Post to completion, histogram
//   ferry_kv_transfer_registered_regions{transport}           live registrations
//   ferry_kv_transfer_registered_bytes{transport}
//   ferry_kv_transfer_notifications_total{transport, outcome} awaits finished ("ok", "failed",
//                                                             "deadline_exceeded")
//
// `transport` is what carried the bytes (KvTransport::PeerTransport: "ucx:tcp", "ucx:posix+cma",
// "grpc"), so the label says which transport UCX chose; registrations are labelled with the
// transport's kind ("ucx", "grpc").
//
// Thread-safe.

#ifndef FERRY_SERVICES_TRANSFER_TRANSFER_METRICS_H_
#define FERRY_SERVICES_TRANSFER_TRANSFER_METRICS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "services/transfer/kv_transport.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace ferry {
namespace transfer {

class TransferMetrics {
 public:
  // A null registry records nothing.
  explicit TransferMetrics(prometheus::Registry* registry);

  void RecordTransfer(absl::string_view transport, TransferOp op, uint64_t bytes,
                      absl::Duration latency, const absl::Status& status);
  void RecordNotification(absl::string_view transport, const absl::Status& status);
  void SetRegistered(absl::string_view kind, int64_t regions, uint64_t bytes);

 private:
  prometheus::Family<prometheus::Counter>* bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* transfers_ = nullptr;
  prometheus::Family<prometheus::Counter>* failures_ = nullptr;
  prometheus::Family<prometheus::Histogram>* seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* regions_ = nullptr;
  prometheus::Family<prometheus::Gauge>* region_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* notifications_ = nullptr;
};

// The status code as a metric label: "ok", "deadline_exceeded", "unavailable", ...
std::string StatusCodeLabel(absl::StatusCode code);

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_TRANSFER_METRICS_H_
