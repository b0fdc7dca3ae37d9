// ferry-calibrate: writes a calibration file of the simulated engine (engine/model/sim_timing.h)
// for this machine and model, measured.
//
// Compute: the real model on the CPU backend as a worker builds it (--weights, --kv_dtype,
// --threads), under the real Engine, timed step by step on a designed set of batch shapes
// (step_probe.h); the six step coefficients are fitted to the medians by non-negative least
// squares on relative error (fit.h). kv_bytes_per_token comes from the model's KV layout.
// Link: KV-shaped puts between two KV transports over loopback (link_probe.h). Store: KV-block
// reads from the KV store library on a temporary directory (store_probe.h). Each movement
// measurement can be skipped, or replaced by figures given on the command line.
//
// Prints, for people, a table of measured against fitted time per shape and the fit's errors;
// writes the calibration JSON (SimCalibrationJson) with `name` (CPU, cores, threads, model,
// dtypes) and `source` (this tool, the date, what was measured and how well the fit matches).
//
// Thread-compatible: runs on the calling thread (the backend's threads compute).

#ifndef FERRY_TOOLS_CALIBRATE_CALIBRATE_H_
#define FERRY_TOOLS_CALIBRATE_CALIBRATE_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/sim_timing.h"

namespace ferry {

struct CalibrateOptions {
  // The model and how it runs (as the worker's flags of the same names).
  std::string model;  // a GGUF file or an HF directory ("": DefaultModelPath())
  int threads = 0;    // compute threads (0: one per core, a worker's default for one engine)
  std::string weights = "bf16";   // f32 | bf16
  std::string kv_dtype = "bf16";  // f32 | bf16
  int32_t block_tokens = 64;
  bool quick = false;  // fewer shapes and repeats (DefaultStepPlan(true))

  // What to measure.
  bool compute = true;
  bool link = true;
  bool store = true;
  std::string link_kind = "ucx";  // ucx | grpc
  std::string link_tls = "tcp";   // UCX_TLS of the link transports
  std::string store_dir;          // a temporary directory is made under it ("": $TMPDIR or /tmp)
  // Given (>= 0): used as they are, and that side (link or store) is not measured; a side given
  // only one of its two figures takes 0 for the other.
  double link_bandwidth = -1;  // bytes/s
  double link_latency = -1;    // s
  double store_bandwidth = -1;
  double store_latency = -1;

  std::string out;   // where the JSON goes ("": printed only)
  std::string name;  // the calibration's name ("": from the CPU, the model and the dtypes)
  int gpus_per_worker = 1;
};

// Measures, fits, writes options.out; the report (tables, errors) goes to `report`.
absl::StatusOr<SimCalibration> RunCalibration(const CalibrateOptions& options,
                                              std::ostream& report);

}  // namespace ferry

#endif  // FERRY_TOOLS_CALIBRATE_CALIBRATE_H_
