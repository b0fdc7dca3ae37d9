// ferry-calibrate: measures this machine's real engine, KV link and KV store and writes the
// simulated engine's calibration file (tools/calibrate/calibrate.h; `./ferry calibrate ARGS`).
//
//   ferry-calibrate --out deploy/sim/cpu-smollm2-135m.json
//   ferry-calibrate --threads 1 --out deploy/sim/cpu-smollm2-135m-1thread.json
//   ferry-calibrate --quick --nostore --link_bandwidth 50e9 --link_latency 5e-6
//
// Exit status: 0 when the file was written, 1 when a measurement failed, 2 on bad usage.

#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "services/common/command_line.h"
#include "tools/calibrate/calibrate.h"

ABSL_FLAG(std::string, model, "", "a GGUF file or an HF directory (default: ferry's model)");
ABSL_FLAG(int, threads, 0, "compute threads (0: one per core, a worker's default)");
ABSL_FLAG(std::string, weights, "bf16", "weight dtype: bf16 | f32 | native (as the worker's flag)");
ABSL_FLAG(std::string, kv_dtype, "bf16", "KV cache dtype: bf16 | f32 (as the worker's flag)");
ABSL_FLAG(bool, quick, false, "fewer shapes and repeats (about a third of the time)");
ABSL_FLAG(bool, compute, true, "measure the engine's step times (--nocompute: all 0)");
ABSL_FLAG(bool, link, true, "measure the KV link (--nolink: instant)");
ABSL_FLAG(bool, store, true, "measure the KV store's reads (--nostore: instant)");
ABSL_FLAG(std::string, link_kind, "ucx", "the link's KV transport: ucx | grpc");
ABSL_FLAG(std::string, link_tls, "tcp", "UCX transports of the link (UCX_TLS syntax)");
ABSL_FLAG(std::string, store_dir, "",
          "the store is measured in a temporary directory under this (default $TMPDIR or /tmp)");
ABSL_FLAG(double, link_bandwidth, -1,
          "link bytes/s to use instead of measuring the link (with --link_latency)");
ABSL_FLAG(double, link_latency, -1, "link latency in seconds, instead of measuring it");
ABSL_FLAG(double, store_bandwidth, -1,
          "store read bytes/s to use instead of measuring the store (with --store_latency)");
ABSL_FLAG(double, store_latency, -1, "store read latency in seconds, instead of measuring it");
ABSL_FLAG(std::string, out, "", "write the calibration JSON here (default: print it)");
ABSL_FLAG(std::string, name, "", "the calibration's name (default: CPU, model and dtypes)");
ABSL_FLAG(int, gpus_per_worker, 1, "accelerators one worker stands for");

int main(int argc, char** argv) {
  const std::vector<char*> args = ferry::ParseProgramCommandLine(
      "ferry-calibrate",
      "measures the real engine, the KV link and the KV store, and writes the simulated "
      "engine's calibration file (--out FILE)",
      argc, argv);
  if (args.size() > 1) {
    std::fprintf(stderr, "ferry-calibrate: unexpected argument '%s' (flags only)\n", args[1]);
    return 2;
  }
  ferry::CalibrateOptions options;
  options.model = absl::GetFlag(FLAGS_model);
  options.threads = absl::GetFlag(FLAGS_threads);
  options.weights = absl::GetFlag(FLAGS_weights);
  options.kv_dtype = absl::GetFlag(FLAGS_kv_dtype);
  options.quick = absl::GetFlag(FLAGS_quick);
  options.compute = absl::GetFlag(FLAGS_compute);
  options.link = absl::GetFlag(FLAGS_link);
  options.store = absl::GetFlag(FLAGS_store);
  options.link_kind = absl::GetFlag(FLAGS_link_kind);
  options.link_tls = absl::GetFlag(FLAGS_link_tls);
  options.store_dir = absl::GetFlag(FLAGS_store_dir);
  options.link_bandwidth = absl::GetFlag(FLAGS_link_bandwidth);
  options.link_latency = absl::GetFlag(FLAGS_link_latency);
  options.store_bandwidth = absl::GetFlag(FLAGS_store_bandwidth);
  options.store_latency = absl::GetFlag(FLAGS_store_latency);
  options.out = absl::GetFlag(FLAGS_out);
  options.name = absl::GetFlag(FLAGS_name);
  options.gpus_per_worker = absl::GetFlag(FLAGS_gpus_per_worker);
  if (options.threads < 0 || options.gpus_per_worker < 1) {
    std::fprintf(stderr, "ferry-calibrate: --threads >= 0 and --gpus_per_worker >= 1\n");
    return 2;
  }
  const absl::StatusOr<ferry::SimCalibration> calibration =
      ferry::RunCalibration(options, std::cout);
  if (!calibration.ok()) {
    std::fprintf(stderr, "ferry-calibrate: %s\n", calibration.status().ToString().c_str());
    return calibration.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
