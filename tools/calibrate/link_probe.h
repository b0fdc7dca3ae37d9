// The worker-to-worker KV link for tools/calibrate: the KV transport (services/transfer) between
// two transports of one kind in this process, over loopback (UCX over tcp by default), moving
// KV-shaped puts as a prefill worker's hand-off does: `blocks` segments of one KV block each,
// between random non-adjacent blocks of two pools larger than the last-level cache (so, as in a
// hand-off, neither side's bytes sit in the cache), plus a one-page put for the latency. The
// medians per size are fitted to latency + bytes / bandwidth (FitLatencyAndBandwidth).
//
// What it leaves out: the worker's gRPC round trips around a hand-off (reservation, KvReady),
// and the NIC of a real cluster (loopback tcp is a memory copy through the kernel).
//
// Thread-compatible.

#ifndef FERRY_TOOLS_CALIBRATE_LINK_PROBE_H_
#define FERRY_TOOLS_CALIBRATE_LINK_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/calibrate/fit.h"

namespace ferry {

struct LinkProbeOptions {
  std::string kind = "ucx";  // ucx | grpc
  std::string ucx_tls = "tcp";
  uint64_t block_bytes = 0;  // one KV block of the model (required)
  std::vector<int> block_counts = {1, 4, 16, 64};
  int repeats = 5;                            // per size; the median counts
  int latency_repeats = 20;                   // one-page puts
  uint64_t pool_bytes = uint64_t{512} << 20;  // each side's blocks (at least 2 x the largest put)
};

struct LinkTiming {
  std::string transport;                // what carried it ("ucx:tcp")
  std::vector<MovementSample> samples;  // the median of each size
  MovementFit fit;
};

absl::StatusOr<LinkTiming> MeasureLink(const LinkProbeOptions& options);

}  // namespace ferry

#endif  // FERRY_TOOLS_CALIBRATE_LINK_PROBE_H_
