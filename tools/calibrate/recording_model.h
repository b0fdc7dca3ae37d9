// A ForwardModel that runs another and keeps the shape of every batch it ran: each row's start
// position and new tokens (SimRow), which is what the simulated engine's timing model needs of a
// step and what the engine's StepInfo does not say, and how long the model's Forward took (the
// part of a step the simulated engine replaces: it runs the rest of the engine for real).
// tools/calibrate puts it between the real Engine and the Transformer, so that each on_step time
// comes with its exact batch and its forward time.
//
// Not thread-safe: the engine thread that owns the model also takes the rows (in on_step).

#ifndef FERRY_TOOLS_CALIBRATE_RECORDING_MODEL_H_
#define FERRY_TOOLS_CALIBRATE_RECORDING_MODEL_H_

#include <cstdint>
#include <vector>

#include "engine/model/forward_model.h"
#include "engine/model/sim_timing.h"

namespace ferry {

class RecordingModel final : public ForwardModel {
 public:
  // `model` must outlive this.
  explicit RecordingModel(ForwardModel* model) : model_(model) {}

  const ModelConfig& config() const override { return model_->config(); }
  const Hash128& fingerprint() const override { return model_->fingerprint(); }
  KvBlockLayout KvLayoutFor(int32_t block_tokens) const override {
    return model_->KvLayoutFor(block_tokens);
  }
  KvBlockLayout FullKvLayoutFor(int32_t block_tokens) const override {
    return model_->FullKvLayoutFor(block_tokens);
  }
  KvBlockLayout WindowKvLayoutFor(int32_t block_tokens) const override {
    return model_->WindowKvLayoutFor(block_tokens);
  }
  int32_t max_window() const override { return model_->max_window(); }
  int64_t exact_replay_tokens() const override { return model_->exact_replay_tokens(); }
  const std::vector<std::vector<int64_t>>& expert_token_counts() const override {
    return model_->expert_token_counts();
  }

  // Records the batch's rows, then runs it.
  absl::Status Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                       std::vector<float>* logits, KvBlockPool* window_kv = nullptr) override;

  // The rows of the Forward calls since the last Take, how many calls that was and the seconds
  // they took (wall time, steady clock); clears all three.
  std::vector<SimRow> TakeRows(int* calls, double* seconds);

 private:
  ForwardModel* const model_;
  std::vector<SimRow> rows_;
  int calls_ = 0;
  double seconds_ = 0;
};

}  // namespace ferry

#endif  // FERRY_TOOLS_CALIBRATE_RECORDING_MODEL_H_
