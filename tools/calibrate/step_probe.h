// Step times of the real engine on a designed set of batch shapes: the measurements
// tools/calibrate fits the simulated engine's compute coefficients to (engine/model/sim_timing.h).
//
// Every step is a step of the real Engine (scheduler, the model's Forward, sampling over the
// vocabulary, events, the prefix cache), with its exact batch and the time of its Forward
// recorded by a RecordingModel between the engine and the model. The Forward's time is what the
// coefficients are fitted to: the simulated engine (NullModel with a SimTiming) stands in for the
// model's Forward only, and runs the rest of the step (the scheduler, sampling, events) for real,
// so a whole step's time would count that part twice. The whole step, as the engine times it
// (StepInfo::seconds), is kept beside it for the report. The shapes are forced with the engine's
// own seams, so that no shape costs more than its own compute:
//
//   prefill (n, start)  one request whose first `start` positions arrive as imported blocks (as a
//                       KV store's prefix would: EngineRequest::imported_blocks, reserved with
//                       Engine::Reserve) and whose n new tokens are one chunk (the prefill
//                       phase's engine has prefill_chunk = max_batch_tokens = the largest n);
//                       max_tokens 1: one step, the row (start, n), its first token sampled;
//   decode (b, k)       b decode-only requests resuming after their first token on k imported
//                       positions each (as a decode worker's hand-offs arrive): every step
//                       decodes b rows of about k KV tokens;
//   mixed (b, k, s)     the decode batch plus one prompt of `mixed_prompt` tokens, chunked as the
//                       worker's scheduler does (prefill_chunk 256, max_batch_tokens 512): each
//                       step b decode rows and the chunk at start s (one prompt per round).
// Imported positions hold whatever the pool's memory holds (the caller fills it with a finite
// pattern): attention costs the same whatever the values, and nothing computes them.
//
// Prompts are random token ids (no request shares a prefix with another); sampling is the API's
// default (temperature 1, full vocabulary), end of sequence ignored. Each shape is repeated and its
// median times kept (forward and step); the first decode step of a batch (its admission) is not
// counted, nor are the warm-up steps that grow the model's scratch before anything is measured.
//
// Thread-compatible: runs the engine's steps on the calling thread.

#ifndef FERRY_TOOLS_CALIBRATE_STEP_PROBE_H_
#define FERRY_TOOLS_CALIBRATE_STEP_PROBE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/forward_model.h"
#include "engine/tokenizer/tokenizer.h"
#include "tools/calibrate/fit.h"

namespace ferry {

struct StepPlan {
  std::vector<std::pair<int64_t, int64_t>> prefill;  // (n new tokens, start)
  std::vector<std::pair<int64_t, int64_t>> decode;   // (b rows, k KV tokens each)
  std::vector<std::pair<int64_t, int64_t>> mixed;    // (b rows, k KV tokens each) + a prompt
  int64_t mixed_prompt = 1024;                       // chunked by mixed_chunk
  int64_t mixed_chunk = 256;                         // the worker's prefill_chunk
  int64_t mixed_batch_tokens = 512;                  // the worker's max_batch_tokens
  // Every shape is measured once per round, round after round, so that whatever else the
  // machine does meanwhile spreads over all shapes instead of distorting a few.
  int rounds = 3;
  // Prefill shapes that have taken less than shape_seconds of steps get up to this many more
  // rounds (cheap shapes: more samples of their median).
  int prefill_extra_rounds = 6;
  // Decode steps per shape and round: at least decode_steps, then more until the round has
  // taken shape_seconds / rounds, at most decode_max_steps.
  int decode_steps = 2, decode_max_steps = 5;
  double shape_seconds = 1.0;
};

// The full design (--quick: fewer shapes and repeats).
StepPlan DefaultStepPlan(bool quick);

// The plan in words, for a calibration's `source`: "prefill rows of n=16..1024 new tokens after
// start=0..4096, decode batches of b=1..64 rows with k=64..4096 KV tokens each, ...".
std::string DescribeStepPlan(const StepPlan& plan);

// KV blocks of `block_tokens` the plan holds at once at most.
int64_t KvBlocksNeeded(const StepPlan& plan, int32_t block_tokens);

struct StepShape {
  std::string kind;  // "prefill", "decode" or "mixed"
  int64_t decode_rows = 0;
  int64_t decode_kv = 0;  // KV tokens each decoding row holds as the shape starts
  int64_t prefill_tokens = 0;
  int64_t prefill_start = 0;
  // "prefill n=256 start=1024", "decode b=16 k=512", "mixed b=16 k=512 + 256@768".
  std::string Label() const;
};

struct ShapeTiming {
  StepShape shape;
  StepTerms terms;  // the mean over the shape's steps (decode rows' KV grows a token a step)
  std::vector<SimRow> first_rows;  // the batch of the shape's first measured step
  double median_seconds = 0;       // the model's Forward (what the fit and the simulator model)
  double min_seconds = 0, max_seconds = 0;
  double median_step_seconds = 0;  // the whole engine step (StepInfo::seconds)
  int steps = 0;
};

// Runs the plan on `model` over `pool` (which must have the model's KvLayoutFor layout, hold
// KvBlocksNeeded blocks and have no block in use); `tokenizer` may be null (no detokenization).
// `progress` (may be empty) sees each shape as it is measured. Errors: the engine's, or a step
// whose batch is not the shape the plan meant (Internal, naming both).
absl::StatusOr<std::vector<ShapeTiming>> MeasureStepShapes(
    ForwardModel* model, KvBlockPool* pool, const Tokenizer* tokenizer, const StepPlan& plan,
    const std::function<void(const ShapeTiming&)>& progress);

}  // namespace ferry

#endif  // FERRY_TOOLS_CALIBRATE_STEP_PROBE_H_
