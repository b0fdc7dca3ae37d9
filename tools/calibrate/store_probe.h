// The KV store's reads for tools/calibrate: the store library (kvstore/kv_store.h) on a fresh
// directory, holding one object per KV block of the model, read as a prefill worker reads a
// prefix: `blocks` objects split over `streams` concurrent Get calls (the worker's
// kvstore_read_streams). The store reads with O_DIRECT, so every read reaches the device; where
// the filesystem refuses O_DIRECT the store reads through the page cache and the figures are the
// cache's (StoreTiming::direct_io says which). The medians per size are fitted to latency +
// bytes / bandwidth (FitLatencyAndBandwidth).
//
// What it leaves out: the ferry-kvstore node's gRPC hop and the copy into the worker's pool.
//
// Thread-compatible.

#ifndef FERRY_TOOLS_CALIBRATE_STORE_PROBE_H_
#define FERRY_TOOLS_CALIBRATE_STORE_PROBE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/calibrate/fit.h"

namespace ferry {

struct StoreProbeOptions {
  std::string parent_dir;    // a fresh directory is made under it, and removed after (required)
  uint64_t block_bytes = 0;  // one KV block of the model (required)
  std::vector<int> block_counts = {1, 4, 16, 64};
  int streams = 4;
  int repeats = 5;  // per size; the median counts
};

struct StoreTiming {
  bool direct_io = false;
  std::string dir;
  std::vector<MovementSample> samples;  // the median of each size
  MovementFit fit;
};

absl::StatusOr<StoreTiming> MeasureStore(const StoreProbeOptions& options);

}  // namespace ferry

#endif  // FERRY_TOOLS_CALIBRATE_STORE_PROBE_H_
