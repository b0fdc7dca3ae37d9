// The dense decoder-only transformer (Llama, Mistral, Qwen2, Qwen3 families), config-driven, run
// through a Backend over a paged KV cache (ARCHITECTURE.md §4).
//
//   auto model = Transformer::Create(weights, backend);          // uploads the weights
//   auto pool = KvBlockPool::Create((*model)->KvLayoutFor(64), blocks, &allocator, backend);
//   (*model)->Forward({{prompt, /*start=*/0, blocks}}, **pool, &logits);
//
// One step runs any mix of sequences, each contributing a chunk of new tokens at its next
// positions (a whole prompt, a prefill chunk, or one decode token); each sequence's block table
// must already cover the new positions. K and V of the new tokens are written to the cache
// (rounded to the cache dtype) before attention reads them, so a chunk sees its own tokens
// exactly as a later step would. With a deterministic backend, a row's logits are bit-identical
// however the sequence's tokens were split into steps and whatever else shared the step.
//
// Per layer: h = RmsNorm(x); q, k, v = h Wq (+bq), h Wk (+bk), h Wv (+bv); Qwen3: RmsNorm of each
// q and k head; RoPE on q and k; K/V to the cache; attention (scale 1/sqrt(head_dim), GQA);
// x += attn Wo; h = RmsNorm(x); x += (silu(h Wgate) * h Wup) Wdown. Then the final RmsNorm and the
// LM head (the embedding matrix when tied).
//
// Not thread-safe: one engine thread owns a Transformer.

#ifndef FERRY_ENGINE_MODEL_TRANSFORMER_H_
#define FERRY_ENGINE_MODEL_TRANSFORMER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backends/backend.h"
#include "engine/common/hash128.h"
#include "engine/common/token_id.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/model/forward_model.h"
#include "engine/model/host_weights.h"
#include "engine/model/model_config.h"
#include "engine/parallel/communicator.h"

namespace ferry {

class Transformer final : public ForwardModel {
 public:
  // Uploads `weights` (which may be freed afterwards) to `backend`, which must outlive the model.
  // With `tensor_parallel` of more than one rank (which must outlive the model too), this rank's
  // share only (tensor_parallel.h): config() then has the rank's head and intermediate counts,
  // and every Forward is a collective: each rank calls it with the same batch, on a pool of its
  // own, and all get the same logits.
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(
      const HostWeights& weights, Backend* backend, Communicator* tensor_parallel = nullptr);

  const ModelConfig& config() const override { return config_; }
  const Hash128& fingerprint() const override { return fingerprint_; }
  DType kv_dtype() const { return kv_dtype_; }
  // The layout of this model's KV blocks, in the cache dtype the fingerprint was computed for:
  // every layer in one pool.
  KvBlockLayout KvLayoutFor(int32_t block_tokens) const override;
  // A hybrid model (sliding-window and full-attention layers) may keep its window layers' KV in
  // a pool of their own, where a sequence holds only the blocks its window still covers: the
  // full-attention layers' layout and the window layers' layout. Both have num_layers 0 unless
  // the model has layers of both kinds.
  KvBlockLayout FullKvLayoutFor(int32_t block_tokens) const override;
  KvBlockLayout WindowKvLayoutFor(int32_t block_tokens) const override;
  // The largest sliding window of any layer (0: none).
  int32_t max_window() const override;
  // The sum over the window layers of (window - 1) (ForwardModel::exact_replay_tokens).
  int64_t exact_replay_tokens() const override;

  // Runs one step over `batch`. Appends to `logits` one row of vocab_size floats per requested
  // position (every new token of a sequence with all_logits, none with no_logits, else its
  // last), in batch order.
  // Invalid input (token ids, positions past max_positions, short block tables, a pool of another
  // layout) is an InvalidArgument error and changes nothing.
  // With `window_kv` (a hybrid model), `kv` has FullKvLayoutFor's layout, window_kv
  // WindowKvLayoutFor's, and every sequence its window_blocks; a sequence may replay its window
  // layers (ForwardSequence::replay_end, window_floor).
  absl::Status Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                       std::vector<float>* logits, KvBlockPool* window_kv = nullptr) override;

  // Mixture-of-experts models: tokens routed to each expert since creation, [layer][expert]
  // (empty rows for dense layers), for the per-expert metric.
  const std::vector<std::vector<int64_t>>& expert_token_counts() const override {
    return expert_tokens_;
  }

  // Steps run in a recordable shape (Backend::BeginStep, recorded_step.h) since creation: on a
  // backend that records steps (max_recorded_rows() > 0), the decode steps of a dense model
  // without tensor parallelism whose batch fits.
  int64_t recorded_steps() const { return recorded_steps_; }

 private:
  // Whether the step is a decode step a backend may record (one plain token per sequence, its
  // logits wanted; no images, replays, experts or tensor parallelism).
  bool RecordableStep(absl::Span<const ForwardSequence> batch, bool no_input_rows) const;
  // Pads the step to its recorded shape (recorded_step.h) and sets inputs->max_position; false
  // (nothing changed) when it has none.
  bool PadForRecording(absl::Span<const ForwardSequence> batch, const KvBlockLayout& kl,
                       const KvBlockPool* window_kv, std::vector<int32_t>* ids, StepLayout* layout,
                       StepLayout* window_layout, Backend::StepInputs* inputs) const;
  // Identifies a recorded step's kernels: its shape and every buffer they are bound to.
  uint64_t RecordingKey(int64_t rows, size_t capacity, size_t window_capacity,
                        const KvBlockPool& kv, const KvBlockPool* window_kv) const;

  // Matrices stacked by rows (q | k | v, gate | up): one weight, or where a file stored the parts
  // in different block formats (llama.cpp's Q4_K_M keeps some layers' v in Q6_K) one weight per
  // part, each computed in its own format into its columns of the output. Each output column is
  // computed from its own row alone, so the split changes no bits.
  struct StackedWeight {
    std::vector<DeviceWeight> parts;
  };
  // Per layer: q, k and v projections stacked (rows q | k | v, with their biases likewise), gate
  // and up stacked (rows gate | up).
  struct Layer {
    DeviceMatrix attn_norm, qkv_bias, q_norm, k_norm, mlp_norm;
    StackedWeight qkv, gate_up;
    DeviceWeight o, down;
    // Mixture of experts (config.moe.sparse(layer)): the router, each expert's stacked gate|up
    // and down, the shared expert and its gate.
    bool moe = false;
    DeviceWeight router, shared_down, shared_gate;
    StackedWeight shared_gate_up;
    std::vector<StackedWeight> expert_gate_up;
    std::vector<DeviceWeight> expert_down;
  };

  Transformer(const ModelConfig& config, Backend* backend) : config_(config), backend_(backend) {}
  absl::Status Upload(const HostWeights& weights);
  absl::Status BuildRopeTable();
  // A vector (norm weight, bias) as a 1 x n matrix.
  absl::StatusOr<DeviceMatrix> UploadVector(const std::vector<const HostTensor*>& parts);
  // Matrices stacked by rows, in the backend's weight layout (parts in different formats, F32 or
  // bf16 among them, are computed in bf16).
  absl::StatusOr<DeviceWeight> UploadMatrix(const std::vector<const HostTensor*>& parts);
  // As UploadMatrix, but parts in different block formats stay in their own formats.
  absl::StatusOr<StackedWeight> UploadStacked(const std::vector<const HostTensor*>& parts);
  // out = x * w^T (+ bias): one MatMul per part, into the part's columns of out.
  void MatMulStacked(const DeviceMatrix& x, const StackedWeight& w, const DeviceMatrix* bias,
                     const DeviceMatrix& out);
  // One step's activations: the residual stream x and the logits in fp32, the rest in the
  // backend's activation dtype; carved from `base` (null: only sized), `bytes` in all.
  struct Activations {
    DeviceMatrix x, h, qkv, attn, gate_up, selected, out;
  };
  Activations CarveActivations(char* base, int64_t m, int64_t nl, size_t* bytes) const;
  absl::Status EnsureScratch(int64_t rows, int64_t logit_rows);
  // The mixture-of-experts FFN of layer `l` on the normed rows `h`, written back into `h`.
  absl::Status MoeFfn(int64_t layer, const DeviceMatrix& h);

  const ModelConfig config_;
  Backend* const backend_;
  Communicator* tensor_parallel_ = nullptr;  // more than one rank, or null
  Hash128 fingerprint_;
  DType kv_dtype_ = DType::kBF16;
  std::vector<DeviceBuffer> buffers_;  // owns the vectors and the RoPE table
  DeviceWeight embed_, lm_head_own_;
  const DeviceWeight* lm_head_ = nullptr;  // &embed_ when tied
  DeviceMatrix final_norm_;
  std::vector<Layer> layers_;
  RopeTable rope_;

  // Tokens routed to each expert so far, per MoE layer ([layer][expert]; empty when dense).
  std::vector<std::vector<int64_t>> expert_tokens_;
  DeviceBuffer moe_scratch_;
  int64_t moe_scratch_rows_ = 0;

  int64_t recorded_steps_ = 0;
  // Activations for up to scratch_rows_ rows (grown on demand).
  DeviceBuffer scratch_;
  int64_t scratch_rows_ = 0;
  int64_t scratch_logit_rows_ = 0;
};

// inv_freq[i] of RoPE for a config (i < head_dim / 2), with its rope_scaling, computed in float32
// the way HF transformers computes it. Exposed for tests.
std::vector<float> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_TRANSFORMER_H_
