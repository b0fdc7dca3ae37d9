#include "engine/model/host_weights.h"

#include <chrono>

#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"

namespace ferry {

int64_t HostTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace model_internal {

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status FinishLoad(ModelFingerprintBuilder& fingerprint, const std::string& kv_dtype,
                        WeightDType dtype, double start_seconds, HostWeights* weights) {
  const ModelConfig& c = weights->config;
  fingerprint.SetKvLayout(KvLayout{kv_dtype, static_cast<uint32_t>(c.num_layers),
                                   static_cast<uint32_t>(c.num_kv_heads),
                                   static_cast<uint32_t>(c.head_dim)});
  fingerprint.SetWeightDtype(dtype == WeightDType::kF32 ? "f32" : "bf16");
  ASSIGN_OR_RETURN(weights->fingerprint, fingerprint.Finish());
  weights->kv_dtype = kv_dtype;
  weights->load_seconds = SteadySeconds() - start_seconds;
  return absl::OkStatus();
}

}  // namespace model_internal
}  // namespace ferry
