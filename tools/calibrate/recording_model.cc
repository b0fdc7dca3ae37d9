#include "tools/calibrate/recording_model.h"

#include <chrono>
#include <utility>

namespace ferry {

absl::Status RecordingModel::Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                                     std::vector<float>* logits, KvBlockPool* window_kv) {
  ++calls_;
  for (const ForwardSequence& s : batch) {
    rows_.push_back({s.start_position, static_cast<int64_t>(s.tokens.size())});
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = model_->Forward(batch, kv, logits, window_kv);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return status;
}

std::vector<SimRow> RecordingModel::TakeRows(int* calls, double* seconds) {
  *calls = std::exchange(calls_, 0);
  *seconds = std::exchange(seconds_, 0.0);
  return std::exchange(rows_, {});
}

}  // namespace ferry
