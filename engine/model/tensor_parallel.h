// Tensor parallelism of the dense transformer (Megatron's split): rank r of n holds
//   q, k, v projections   its heads' rows (heads / n query heads, kv_heads / n KV heads), biases
//                         likewise: a column split of the output
//   o projection          the columns of its query heads: a row split of the input, whose partial
//                         outputs the ranks all-reduce (sum in rank order, communicator.h)
//   gate, up              rows [r * f / n, (r + 1) * f / n) of the intermediate
//   down                  the same columns: a row split, all-reduced
// and all of the embedding, the norms and the LM head (each rank computes the whole logits). So
// each rank's KV pool holds its KV heads only, and one step costs two all-reduces per layer.
//
// ShardWeights cuts a rank's share out of the whole weights: a HostWeights whose config has the
// rank's head and intermediate counts, and whose fingerprint names the split (a rank's KV blocks
// hold some heads only, so they never pass for another split's). Errors (InvalidArgument): heads,
// KV heads or the intermediate size not divisible by n, a mixture-of-experts model, or a
// block-format matrix whose split would cut its blocks.

#ifndef FERRY_ENGINE_MODEL_TENSOR_PARALLEL_H_
#define FERRY_ENGINE_MODEL_TENSOR_PARALLEL_H_

#include "absl/status/statusor.h"
#include "engine/model/host_weights.h"

namespace ferry {

absl::StatusOr<HostWeights> ShardWeights(const HostWeights& weights, int rank, int size);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_TENSOR_PARALLEL_H_
