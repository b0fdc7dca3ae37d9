#include "tools/calibrate/recording_model.h"

#include <utility>

namespace ferry {

absl::Status RecordingModel::Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                                     std::vector<float>* logits, KvBlockPool* window_kv) {
  ++calls_;
  for (const ForwardSequence& s : batch) {
    rows_.push_back({s.start_position, static_cast<int64_t>(s.tokens.size())});
  }
  return model_->Forward(batch, kv, logits, window_kv);
}

std::vector<SimRow> RecordingModel::TakeRows(int* calls) {
  *calls = calls_;
  calls_ = 0;
  return std::exchange(rows_, {});
}

}  // namespace ferry
