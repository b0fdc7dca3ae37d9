// The checks an engine makes of a request before it takes it (Engine::Submit, Engine::Validate):
// ranges (prompt, n, max and min tokens, sampling, stop ids and strings), images (sorted,
// disjoint placeholder spans inside the prompt, embeddings of placeholder_length x hidden_size
// floats), resume points that add up, and for a decode-only request or one with imports, blocks
// that cover what they claim in the engine's KV pools. Pure: reads the request and the pools'
// state, changes nothing.

#ifndef FERRY_ENGINE_REQUEST_VALIDATION_H_
#define FERRY_ENGINE_REQUEST_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/kv/hybrid_kv_cache.h"
#include "engine/request.h"

namespace ferry {

// What a request is checked against: the model's vocabulary and positions, the engine's max_n,
// whether it has a tokenizer (stop strings need one), and its KV cache.
struct RequestLimits {
  int64_t vocab_size = 0;
  int64_t max_positions = 0;
  int32_t max_n = 16;
  bool has_tokenizer = false;
  int64_t hidden_size = 0;  // the width of an image's embedding rows
  const HybridKvCache* kv = nullptr;
};

// InvalidArgument naming what is wrong; OK for a request the engine can run.
absl::Status ValidateRequest(const EngineRequest& request, const RequestLimits& limits);

// The positions a decode-only request's imported KV covers: the prompt and the generated tokens
// but the last (whose KV its first step computes). Validated requests only.
int64_t DecodeOnlyPositions(const EngineRequest& request);

}  // namespace ferry

#endif  // FERRY_ENGINE_REQUEST_VALIDATION_H_
