// The simulated engine's timing model (ARCHITECTURE.md §1 `--engine=sim`; the discrete-event
// simulator in tools/sim): how long the model's forward pass of an engine step, a KV transfer
// between workers and a read from the KV store take on the hardware a calibration file describes,
// so that the real worker service (or the real engine, scheduler and router libraries under a
// fake clock) runs with the compute replaced by this model. The rest of a step (scheduling,
// sampling, events) is not modeled: the simulated engine runs it for real (NullModel's logits),
// so a calibration must not count it (tools/calibrate times the forward pass alone).
//
// The model (all times in seconds, divided by the worker's speed factor for compute only):
//   step     = step_overhead_s
//            + sum over prefill rows of   prefill_token_s x n + prefill_attention_s x pairs
//              (n the row's new tokens, start its cached/previous positions, and
//               pairs = n x start + n x (n + 1) / 2: each new token attends to what precedes it)
//            + when any row decodes:      decode_step_s + decode_row_s x rows
//                                         + decode_kv_token_s x (KV tokens the decoding rows read)
//   A row with one token decodes (as the engine's StepInfo counts it); any other row prefills.
//   transfer = link_latency_s + bytes / (link_bandwidth_bytes_per_s / sharing)
//              (bytes = tokens x kv_bytes_per_token; `sharing` the transfers sharing the link:
//               processor sharing, each gets an equal part of the bandwidth)
//   store    = store_latency_s + bytes / store_read_bytes_per_s
// KV capacity: a pool of P bytes holds P / kv_bytes_per_token tokens of the simulated model
// (the simulated engine keeps only 8 bytes of state a position: NullModel's).
//
// A calibration file is JSON with the fields of SimCalibration by name (unknown keys are an
// error; `name` and `source` say which hardware and model, and where each number comes from).
// Comments are allowed; an absent field keeps its default (0; gpus_per_worker 1) except
// kv_bytes_per_token, which is required and positive; numbers must be finite and >= 0.
// tools/calibrate fits the compute coefficients from the real CPU engine.
//
// Thread-safe: immutable after construction.

#ifndef FERRY_ENGINE_MODEL_SIM_TIMING_H_
#define FERRY_ENGINE_MODEL_SIM_TIMING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ferry {

struct SimCalibration {
  std::string name;         // e.g. "cpu-2core/SmolLM2-135M bf16"
  std::string source;       // where the numbers come from (a fit, a paper, a vendor sheet)
  int gpus_per_worker = 1;  // accelerators one worker stands for (GPU-hours)
  double kv_bytes_per_token = 0;
  // Compute.
  double step_overhead_s = 0;
  double prefill_token_s = 0;
  double prefill_attention_s = 0;
  double decode_step_s = 0;
  double decode_row_s = 0;
  double decode_kv_token_s = 0;
  // Movement.
  double link_bandwidth_bytes_per_s = 0;  // worker to worker (KV hand-off); 0: instant
  double link_latency_s = 0;
  double store_read_bytes_per_s = 0;  // one worker's reads from the KV store; 0: instant
  double store_latency_s = 0;
};

// Parses a calibration file's text; InvalidArgument names the bad or unknown key.
absl::StatusOr<SimCalibration> ParseSimCalibration(const std::string& json_text);
absl::StatusOr<SimCalibration> LoadSimCalibration(const std::string& path);
// The file's text for `calibration` (ParseSimCalibration reads it back exactly).
std::string SimCalibrationJson(const SimCalibration& calibration);

// One row of a step: `tokens` new positions after `start` earlier ones.
struct SimRow {
  int64_t start = 0;
  int64_t tokens = 0;
};

class SimTiming {
 public:
  // `speed` > 0 scales compute (0.5: a GPU half as fast).
  explicit SimTiming(SimCalibration calibration, double speed = 1.0);

  const SimCalibration& calibration() const { return calibration_; }
  double speed() const { return speed_; }

  double StepSeconds(absl::Span<const SimRow> rows) const;
  // A hand-off of `tokens` positions' KV while `sharing` >= 1 transfers share the link (below 1
  // counts as 1). 0 for no tokens; a bandwidth of 0 makes the bytes free (the latency stays).
  double TransferSeconds(int64_t tokens, int sharing = 1) const;
  // 0 for no tokens; a read speed of 0 makes the bytes free (the latency stays).
  double StoreReadSeconds(int64_t tokens) const;
  double KvBytes(int64_t tokens) const;
  // Tokens of the simulated model's KV that `pool_bytes` hold (whole ones; 0 without a
  // positive kv_bytes_per_token).
  int64_t KvTokens(int64_t pool_bytes) const;

 private:
  SimCalibration calibration_;
  double speed_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_SIM_TIMING_H_
