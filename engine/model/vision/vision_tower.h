// A LLaVA-style model's vision tower (CLIP) and multimodal projector, on the CPU: preprocessed
// pixels in, one embedding row per image placeholder token out, as transformers'
// LlavaForConditionalGeneration.get_image_features computes them.
//
//   patches (conv with stride = patch, computed as a product over the unfolded patches)
//   + class embedding first, + position embeddings -> pre_layrnorm
//   -> encoder layers (LayerNorm, q/k/v with biases, softmax attention over all the image's
//      positions, non-causal, scale head_dim^-0.5, out_proj, residual; LayerNorm, fc1,
//      activation, fc2, residual), as far as hidden_states[vision_feature_layer]
//   -> CLS dropped ("default") or kept ("full") -> linear_1 -> activation -> linear_2
//
// Loaded from an HF LLaVA directory: config.json and model.safetensors (or the shards of
// model.safetensors.index.json), tensors vision_tower.vision_model.* and multi_modal_projector.*
// (F32, F16 or BF16, held as f32); the text model's language_model.* tensors are left alone.
// Every tower and projector tensor must be present once with its shape; an unknown one under
// those prefixes is an error.
//
// Arithmetic (VisionPrecision::kF32, the default and the path checked against transformers at
// 1e-4): fp32 activations and weights; the matrix products are the CPU backend's fp32 kernel
// (engine/backends/cpu/cpu_kernels.h: one accumulator per output element, a fused multiply-add
// per term in increasing order, the same bits on every instruction set), attention through the
// backend's fp32 attention kernels, LayerNorm plain loops in a fixed order (statistics in
// double). kBf16: the matrix products (patch embedding, q/k/v/out, MLP, projector) are the
// backend's bf16 product as its bf16 MatMul runs it (weights rounded to bf16 at Load, each
// product's input rows rounded to bf16, fp32 accumulation: AVX512-BF16's dot product where the
// CPU has it, about twice the fp32 FMA rate), and so are attention's two products (queries and
// keys rounded to bf16 for the scores, the probabilities and values for the weighted sum);
// softmax, norms and residuals stay fp32, quick_gelu goes through the kernels' vectorised
// silu_mul. Its outputs differ from fp32 by bf16 rounding (checked against transformers' fp32
// outputs at a looser, stated bound: vision_reference_test.sh). Either way work is spread over
// the shared thread pool but each output element is computed by one thread, so results are
// bit-identical from run to run and whatever the thread count. FERRY_CPU_ISA picks the variant
// as it does for the backend (an unknown or unsupported one fails Load).
//
// Thread-safe after Load: Encode and the other const methods may run concurrently.

#ifndef FERRY_ENGINE_MODEL_VISION_VISION_TOWER_H_
#define FERRY_ENGINE_MODEL_VISION_VISION_TOWER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/hash128.h"
#include "engine/model/vision/vision_config.h"

namespace ferry {

struct CpuKernels;

// The matrix products' arithmetic (see above).
enum class VisionPrecision { kF32, kBf16 };

class VisionTower {
 public:
  // A matrix packed for the CPU kernels: PackPanels' fp32 layout, or PackPanelsBf16's (exactly
  // one of the two is non-empty).
  struct Matrix {
    std::vector<float> f32;
    std::vector<uint16_t> bf16;
  };

  // Reads DIR/config.json and the tower and projector tensors (see above).
  static absl::StatusOr<VisionTower> Load(const std::string& dir,
                                          VisionPrecision precision = VisionPrecision::kF32);

  VisionPrecision precision() const { return precision_; }

  const VisionConfig& config() const { return config_; }
  int64_t image_size() const { return config_.image_size; }
  int64_t num_image_tokens() const { return config_.num_image_tokens(); }
  int64_t text_hidden_size() const { return config_.text_hidden_size; }

  // Digest of the tower and projector: their configuration, the precision (kBf16 only: fp32
  // digests carry no tag) and every tensor's name, shape and f32 values as read.
  // ExtendModelFingerprint (model_fingerprint.h) folds it into the text model's fingerprint.
  const Hash128& digest() const { return digest_; }

  // The image's embeddings: num_image_tokens() rows of text_hidden_size() floats, row-major.
  // `pixels` is the preprocessed image, config().pixel_count() floats (CHW, as the image
  // processor's pixel_values); another size is InvalidArgument.
  absl::StatusOr<std::vector<float>> Encode(absl::Span<const float> pixels) const;

  // hidden_states[layer] of the tower as transformers numbers them (0: the embeddings after
  // pre_layrnorm; l: the output of encoder layer l - 1), for 0 <= layer <= num_layers:
  // num_positions() rows (CLS first) of hidden_size floats.
  absl::StatusOr<std::vector<float>> HiddenState(absl::Span<const float> pixels,
                                                 int64_t layer) const;

  // The projector alone: `rows` rows of hidden_size floats -> rows of text_hidden_size.
  std::vector<float> Project(const std::vector<float>& features, int64_t rows) const;

 private:
  VisionTower() = default;
  // The tensor `name` (an HF name without the "vision_tower.vision_model." prefix for the tower;
  // Load checked that it exists).
  const std::vector<float>& T(const std::string& name) const;
  // A matrix's packed panels.
  const Matrix& P(const std::string& name) const;
  // One encoder layer applied in place to x (num_positions x hidden_size).
  void EncoderLayer(int64_t layer, std::vector<float>& x) const;

  VisionConfig config_;
  const CpuKernels* kernels_ = nullptr;                // the CPU's widest instruction set
  std::map<std::string, std::vector<float>> tensors_;  // vectors (norms, biases, embeddings)
  std::map<std::string, Matrix> packed_;               // matrices, packed
  VisionPrecision precision_ = VisionPrecision::kF32;
  Hash128 digest_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_VISION_VISION_TOWER_H_
