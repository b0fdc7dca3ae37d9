#include "engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/common/float_math.h"
#include "engine/common/log.h"
#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"
#include "engine/model/dequantize.h"
#include "engine/model/moe_routing.h"
#include "engine/model/recorded_step.h"
#include "engine/model/tensor_parallel.h"

namespace ferry {
namespace {

constexpr double kPi = 3.14159265358979323846;

// Positions beyond this get no RoPE table row: the table would be larger than the model.
constexpr int64_t kMaxRopeRows = int64_t{1} << 20;

}  // namespace

std::vector<float> RopeInverseFrequencies(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv(half);
  const float base = static_cast<float>(c.rope_theta);
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in float32.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(c.head_dim);
    const float power = static_cast<float>(std::pow(static_cast<double>(base), exponent));
    inv[i] = 1.0f / power;
  }
  const RopeScaling& s = c.rope_scaling;
  const float factor = static_cast<float>(s.factor);
  if (s.type == RopeScaling::Type::kLinear) {
    for (float& f : inv) f = f / factor;
  } else if (s.type == RopeScaling::Type::kLlama3) {
    // transformers' _compute_llama3_parameters, in float32.
    const float old_len = static_cast<float>(s.original_max_position_embeddings);
    const float low = static_cast<float>(s.low_freq_factor);
    const float high = static_cast<float>(s.high_freq_factor);
    const float low_freq_wavelen = old_len / low;
    const float high_freq_wavelen = old_len / high;
    for (float& f : inv) {
      const float wavelen = static_cast<float>(2 * kPi) / f;
      float scaled = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = (old_len / wavelen - low) / (high - low);
      const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) scaled = smoothed;
      f = scaled;
    }
  }
  return inv;
}

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(const HostWeights& weights,
                                                                 Backend* backend,
                                                                 Communicator* tensor_parallel) {
  if (tensor_parallel != nullptr && tensor_parallel->size() > 1) {
    ASSIGN_OR_RETURN(const HostWeights shard,
                     ShardWeights(weights, tensor_parallel->rank(), tensor_parallel->size()));
    ASSIGN_OR_RETURN(std::unique_ptr<Transformer> model, Create(shard, backend));
    model->tensor_parallel_ = tensor_parallel;
    return model;
  }
  RETURN_IF_ERROR(weights.config.Validate());
  if (weights.config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", weights.config.head_dim, " is odd; RoPE needs pairs"));
  }
  std::unique_ptr<Transformer> model(new Transformer(weights.config, backend));
  model->fingerprint_ = weights.fingerprint;
  const std::string tag = backend->fingerprint_tag();
  if (!tag.empty()) {
    model->fingerprint_ =
        ExtendModelFingerprintForCompute(weights.fingerprint, absl::StrCat("backend=", tag));
  }
  if (weights.kv_dtype == "f32") {
    model->kv_dtype_ = DType::kF32;
  } else if (weights.kv_dtype == "bf16") {
    model->kv_dtype_ = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache dtype '", weights.kv_dtype, "' is not supported (f32, bf16)"));
  }
  RETURN_IF_ERROR(model->Upload(weights));
  RETURN_IF_ERROR(model->BuildRopeTable());
  return model;
}

int32_t Transformer::max_window() const {
  int32_t w = 0;
  for (int64_t l = 0; l < config_.num_layers; ++l) w = std::max(w, config_.window(l));
  return w;
}

int64_t Transformer::exact_replay_tokens() const {
  int64_t tokens = 0;
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    if (config_.window(l) > 0) tokens += config_.window(l) - 1;
  }
  return tokens;
}

KvBlockLayout Transformer::FullKvLayoutFor(int32_t block_tokens) const {
  KvBlockLayout layout = KvLayoutFor(block_tokens);
  int32_t full = 0;
  for (int64_t l = 0; l < config_.num_layers; ++l) full += config_.window(l) == 0;
  layout.num_layers = full > 0 && full < config_.num_layers ? full : 0;
  return layout;
}

KvBlockLayout Transformer::WindowKvLayoutFor(int32_t block_tokens) const {
  KvBlockLayout layout = FullKvLayoutFor(block_tokens);
  if (layout.num_layers > 0) layout.num_layers = config_.num_layers - layout.num_layers;
  return layout;
}

KvBlockLayout Transformer::KvLayoutFor(int32_t block_tokens) const {
  KvBlockLayout layout;
  layout.num_layers = static_cast<int32_t>(config_.num_layers);
  layout.num_kv_heads = static_cast<int32_t>(config_.num_kv_heads);
  layout.head_dim = static_cast<int32_t>(config_.head_dim);
  layout.block_tokens = block_tokens;
  layout.dtype = kv_dtype_;
  return layout;
}

namespace {

// The elements of `parts`, one after the other, as bytes of `dtype`.
std::vector<char> Concatenated(const std::vector<const HostTensor*>& parts, DType dtype) {
  std::vector<char> bytes;
  for (const HostTensor* t : parts) {
    const char* data = dtype == DType::kF32 ? reinterpret_cast<const char*>(t->f32.data())
                                            : reinterpret_cast<const char*>(t->bf16.data());
    bytes.insert(bytes.end(), data, data + t->elements() * DTypeBytes(dtype));
  }
  return bytes;
}

DType DeviceDType(const HostTensor& t) {
  return t.dtype == WeightDType::kF32 ? DType::kF32 : DType::kBF16;
}

// A tensor as bf16 values (its own, or its blocks dequantized).
absl::StatusOr<std::vector<uint16_t>> AsBf16(const HostTensor& t) {
  if (t.quant == WeightQuant::kNone) {
    if (t.dtype == WeightDType::kBF16) return t.bf16;
    std::vector<uint16_t> out(t.f32.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = FloatToBf16(t.f32[i]);
    return out;
  }
  std::vector<uint16_t> out(t.elements());
  RETURN_IF_ERROR(DequantizeToBf16(GgmlTypeOfWeightQuant(t.quant), t.blocks.data(), t.blocks.size(),
                                   out.size(), out.data()));
  return out;
}

}  // namespace

absl::StatusOr<DeviceMatrix> Transformer::UploadVector(
    const std::vector<const HostTensor*>& parts) {
  const DType dtype = DeviceDType(*parts[0]);
  for (const HostTensor* t : parts) {
    if (t->quant != WeightQuant::kNone || DeviceDType(*t) != dtype) {
      return absl::InvalidArgumentError("stacked weight vectors differ in type");
    }
  }
  const std::vector<char> bytes = Concatenated(parts, dtype);
  const int64_t n = static_cast<int64_t>(bytes.size() / DTypeBytes(dtype));
  ASSIGN_OR_RETURN(DeviceBuffer buffer, backend_->Allocate(bytes.size()));
  backend_->CopyToDevice(buffer.data(), bytes.data(), bytes.size());
  DeviceMatrix m = DeviceMatrix::Dense(buffer.data(), dtype, 1, n);
  buffers_.push_back(std::move(buffer));
  return m;
}

absl::StatusOr<DeviceWeight> Transformer::UploadMatrix(
    const std::vector<const HostTensor*>& parts) {
  const int64_t cols = parts[0]->shape.back();
  int64_t rows = 0;
  bool same_quant = true, same_dtype = true;
  for (const HostTensor* t : parts) {
    if (t->shape.size() != 2 || t->shape[1] != cols) {
      return absl::InvalidArgumentError("stacked weight matrices differ in width");
    }
    rows += t->shape[0];
    same_quant = same_quant && t->quant == parts[0]->quant;
    same_dtype =
        same_dtype && t->quant == WeightQuant::kNone && DeviceDType(*t) == DeviceDType(*parts[0]);
  }
  const WeightQuant quant = parts[0]->quant;
  if (same_quant && quant != WeightQuant::kNone) {
    absl::StatusOr<DeviceWeight> w;
    if (parts.size() == 1) {
      w = backend_->UploadQuantizedWeight(parts[0]->blocks.data(), parts[0]->blocks.size(), quant,
                                          rows, cols);
    } else {
      std::vector<uint8_t> bytes;
      for (const HostTensor* t : parts) {
        bytes.insert(bytes.end(), t->blocks.begin(), t->blocks.end());
      }
      w = backend_->UploadQuantizedWeight(bytes.data(), bytes.size(), quant, rows, cols);
    }
    // A backend without kernels for this block format computes it in bf16 (below).
    if (w.ok() || !absl::IsUnimplemented(w.status())) return w;
  }
  if (same_dtype) {
    const DType dtype = DeviceDType(*parts[0]);
    if (parts.size() == 1) {
      const void* data = dtype == DType::kF32 ? static_cast<const void*>(parts[0]->f32.data())
                                              : static_cast<const void*>(parts[0]->bf16.data());
      return backend_->UploadWeight(data, dtype, rows, cols);
    }
    const std::vector<char> bytes = Concatenated(parts, dtype);
    return backend_->UploadWeight(bytes.data(), dtype, rows, cols);
  }
  // Parts stored in different types (a file that quantized q, k and v differently): the stacked
  // matrix is computed in bf16.
  std::vector<uint16_t> values;
  for (const HostTensor* t : parts) {
    ASSIGN_OR_RETURN(std::vector<uint16_t> part, AsBf16(*t));
    values.insert(values.end(), part.begin(), part.end());
  }
  return backend_->UploadWeight(values.data(), DType::kBF16, rows, cols);
}

absl::StatusOr<Transformer::StackedWeight> Transformer::UploadStacked(
    const std::vector<const HostTensor*>& parts) {
  StackedWeight w;
  bool all_blocks = true, same = true;
  for (const HostTensor* t : parts) {
    all_blocks = all_blocks && t->quant != WeightQuant::kNone;
    same = same && t->quant == parts[0]->quant;
  }
  if (all_blocks && !same) {
    for (const HostTensor* t : parts) {
      ASSIGN_OR_RETURN(DeviceWeight part, UploadMatrix({t}));
      w.parts.push_back(std::move(part));
    }
  } else {
    ASSIGN_OR_RETURN(DeviceWeight whole, UploadMatrix(parts));
    w.parts.push_back(std::move(whole));
  }
  return w;
}

void Transformer::MatMulStacked(const DeviceMatrix& x, const StackedWeight& w,
                                const DeviceMatrix* bias, const DeviceMatrix& out) {
  int64_t col = 0;
  for (const DeviceWeight& part : w.parts) {
    const DeviceMatrix part_bias =
        bias != nullptr ? bias->ColRange(col, part.rows) : DeviceMatrix();
    backend_->MatMul(x, part, bias != nullptr ? &part_bias : nullptr, out.ColRange(col, part.rows));
    col += part.rows;
  }
}

absl::Status Transformer::Upload(const HostWeights& weights) {
  auto get = [&](const std::string& name) -> absl::StatusOr<const HostTensor*> {
    auto it = weights.tensors.find(name);
    if (it == weights.tensors.end()) {
      return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
    }
    return &it->second;
  };
  // Shapes were checked by the loaders; check the ones the kernels rely on once more.
  const int64_t h = config_.hidden_size, q = config_.num_heads * config_.head_dim;
  const int64_t kv = config_.num_kv_heads * config_.head_dim, f = config_.intermediate_size;
  auto shaped = [&](const std::string& name,
                    std::vector<int64_t> shape) -> absl::StatusOr<const HostTensor*> {
    ASSIGN_OR_RETURN(const HostTensor* t, get(name));
    if (t->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has the wrong shape"));
    }
    return t;
  };
  ASSIGN_OR_RETURN(const HostTensor* embed,
                   shaped("model.embed_tokens.weight", {config_.vocab_size, h}));
  ASSIGN_OR_RETURN(embed_, UploadMatrix({embed}));
  ASSIGN_OR_RETURN(const HostTensor* norm, shaped("model.norm.weight", {h}));
  ASSIGN_OR_RETURN(final_norm_, UploadVector({norm}));
  if (config_.tie_word_embeddings) {
    lm_head_ = &embed_;
  } else {
    ASSIGN_OR_RETURN(const HostTensor* head, shaped("lm_head.weight", {config_.vocab_size, h}));
    ASSIGN_OR_RETURN(lm_head_own_, UploadMatrix({head}));
    lm_head_ = &lm_head_own_;
  }
  layers_.resize(config_.num_layers);
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer& l = layers_[i];
    ASSIGN_OR_RETURN(const HostTensor* in_norm, shaped(p + "input_layernorm.weight", {h}));
    ASSIGN_OR_RETURN(l.attn_norm, UploadVector({in_norm}));
    ASSIGN_OR_RETURN(const HostTensor* wq, shaped(p + "self_attn.q_proj.weight", {q, h}));
    ASSIGN_OR_RETURN(const HostTensor* wk, shaped(p + "self_attn.k_proj.weight", {kv, h}));
    ASSIGN_OR_RETURN(const HostTensor* wv, shaped(p + "self_attn.v_proj.weight", {kv, h}));
    ASSIGN_OR_RETURN(l.qkv, UploadStacked({wq, wk, wv}));
    ASSIGN_OR_RETURN(const HostTensor* wo, shaped(p + "self_attn.o_proj.weight", {h, q}));
    ASSIGN_OR_RETURN(l.o, UploadMatrix({wo}));
    if (config_.attention_bias) {
      ASSIGN_OR_RETURN(const HostTensor* bq, shaped(p + "self_attn.q_proj.bias", {q}));
      ASSIGN_OR_RETURN(const HostTensor* bk, shaped(p + "self_attn.k_proj.bias", {kv}));
      ASSIGN_OR_RETURN(const HostTensor* bv, shaped(p + "self_attn.v_proj.bias", {kv}));
      ASSIGN_OR_RETURN(l.qkv_bias, UploadVector({bq, bk, bv}));
    }
    if (config_.qk_norm) {
      ASSIGN_OR_RETURN(const HostTensor* qn,
                       shaped(p + "self_attn.q_norm.weight", {config_.head_dim}));
      ASSIGN_OR_RETURN(const HostTensor* kn,
                       shaped(p + "self_attn.k_norm.weight", {config_.head_dim}));
      ASSIGN_OR_RETURN(l.q_norm, UploadVector({qn}));
      ASSIGN_OR_RETURN(l.k_norm, UploadVector({kn}));
    }
    ASSIGN_OR_RETURN(const HostTensor* post_norm,
                     shaped(p + "post_attention_layernorm.weight", {h}));
    ASSIGN_OR_RETURN(l.mlp_norm, UploadVector({post_norm}));
    auto swiglu = [&](const std::string& prefix, int64_t width, StackedWeight* gate_up,
                      DeviceWeight* down) -> absl::Status {
      ASSIGN_OR_RETURN(const HostTensor* gate, shaped(prefix + "gate_proj.weight", {width, h}));
      ASSIGN_OR_RETURN(const HostTensor* up, shaped(prefix + "up_proj.weight", {width, h}));
      ASSIGN_OR_RETURN(*gate_up, UploadStacked({gate, up}));
      ASSIGN_OR_RETURN(const HostTensor* dn, shaped(prefix + "down_proj.weight", {h, width}));
      ASSIGN_OR_RETURN(*down, UploadMatrix({dn}));
      return absl::OkStatus();
    };
    const MoeConfig& m = config_.moe;
    if (!m.sparse(i)) {
      RETURN_IF_ERROR(swiglu(p + "mlp.", f, &l.gate_up, &l.down));
      if (m.num_experts > 0) expert_tokens_.emplace_back();
      continue;
    }
    l.moe = true;
    expert_tokens_.emplace_back(m.num_experts, 0);
    ASSIGN_OR_RETURN(const HostTensor* router, shaped(p + "mlp.gate.weight", {m.num_experts, h}));
    ASSIGN_OR_RETURN(l.router, UploadMatrix({router}));
    l.expert_gate_up.resize(m.num_experts);
    l.expert_down.resize(m.num_experts);
    for (int64_t e = 0; e < m.num_experts; ++e) {
      RETURN_IF_ERROR(swiglu(absl::StrCat(p, "mlp.experts.", e, "."), m.expert_intermediate_size,
                             &l.expert_gate_up[e], &l.expert_down[e]));
    }
    if (m.shared_intermediate_size > 0) {
      RETURN_IF_ERROR(swiglu(p + "mlp.shared_expert.", m.shared_intermediate_size,
                             &l.shared_gate_up, &l.shared_down));
    }
    if (m.shared_expert_gate) {
      ASSIGN_OR_RETURN(const HostTensor* g, shaped(p + "mlp.shared_expert_gate.weight", {1, h}));
      ASSIGN_OR_RETURN(l.shared_gate, UploadMatrix({g}));
    }
  }
  return absl::OkStatus();
}

absl::Status Transformer::BuildRopeTable() {
  const int64_t rows = config_.max_position_embeddings;
  if (rows <= 0 || rows > kMaxRopeRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_position_embeddings ", rows, " is out of range (1..", kMaxRopeRows, ")"));
  }
  const int64_t d = config_.head_dim, half = d / 2;
  const std::vector<float> inv = RopeInverseFrequencies(config_);
  std::vector<float> table(rows * d);
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      // The angle rounded to float32 as transformers computes it, then cos/sin rounded once.
      const float angle = static_cast<float>(p) * inv[i];
      table[p * d + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      table[p * d + half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
  }
  ASSIGN_OR_RETURN(DeviceBuffer buffer, backend_->Allocate(table.size() * sizeof(float)));
  backend_->CopyToDevice(buffer.data(), table.data(), table.size() * sizeof(float));
  rope_.table = DeviceMatrix::Dense(buffer.data(), DType::kF32, rows, d);
  buffers_.push_back(std::move(buffer));
  return absl::OkStatus();
}

Transformer::Activations Transformer::CarveActivations(char* base, int64_t m, int64_t nl,
                                                       size_t* bytes) const {
  const ModelConfig& c = config_;
  const DType act = backend_->activation_dtype();
  size_t at = 0;
  auto take = [&](int64_t rows, int64_t cols, DType dtype) {
    DeviceMatrix mat =
        DeviceMatrix::Dense(base == nullptr ? nullptr : base + at, dtype, rows, cols);
    at += (static_cast<size_t>(rows * cols) * DTypeBytes(dtype) + 255) / 256 * 256;
    return mat;
  };
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  Activations a;
  a.x = take(m, c.hidden_size, DType::kF32);
  a.h = take(m, c.hidden_size, act);
  a.qkv = take(m, qd + 2 * kvd, act);
  a.attn = take(m, qd, act);
  a.gate_up = take(m, 2 * c.intermediate_size, act);
  a.selected = take(nl, c.hidden_size, act);
  a.out = take(nl, c.vocab_size, DType::kF32);
  *bytes = at;
  return a;
}

absl::Status Transformer::EnsureScratch(int64_t rows, int64_t logit_rows) {
  if (rows <= scratch_rows_ && logit_rows <= scratch_logit_rows_) return absl::OkStatus();
  rows = std::max(rows, scratch_rows_);
  logit_rows = std::max(logit_rows, scratch_logit_rows_);
  size_t bytes = 0;
  CarveActivations(nullptr, rows, logit_rows, &bytes);
  // Forgotten before the allocation, which may fail (a GPU's memory limit): no later step may
  // carve from a buffer that is gone.
  scratch_rows_ = 0;
  scratch_logit_rows_ = 0;
  scratch_.Reset();
  ASSIGN_OR_RETURN(scratch_, backend_->Allocate(bytes));
  scratch_rows_ = rows;
  scratch_logit_rows_ = logit_rows;
  return absl::OkStatus();
}

absl::Status Transformer::MoeFfn(int64_t layer, const DeviceMatrix& h) {
  const MoeConfig& m = config_.moe;
  const Layer& l = layers_[layer];
  Backend& b = *backend_;
  const int64_t rows = h.rows, hidden = config_.hidden_size, experts = m.num_experts;
  const int64_t width = std::max(m.expert_intermediate_size, m.shared_intermediate_size);
  // Scratch: router logits, the routed rows' inputs, their gate|up, outputs, and the sum.
  const int64_t per_row = experts + 2 * hidden + 2 * width + hidden + 1;
  if (rows > moe_scratch_rows_) {
    moe_scratch_rows_ = 0;
    moe_scratch_.Reset();
    ASSIGN_OR_RETURN(moe_scratch_, b.Allocate(rows * per_row * sizeof(float)));
    moe_scratch_rows_ = rows;
  }
  float* next = static_cast<float*>(moe_scratch_.data());
  auto take = [&](int64_t r, int64_t cols) {
    DeviceMatrix mat = DeviceMatrix::Dense(next, DType::kF32, r, cols);
    next += r * cols;
    return mat;
  };
  const DeviceMatrix logits = take(rows, experts), xin = take(rows, hidden);
  const DeviceMatrix gate_up = take(rows, 2 * width), y = take(rows, hidden);
  const DeviceMatrix sum = take(rows, hidden), shared_logit = take(rows, 1);

  // Routing, on the host (engine/model/moe_routing.h).
  b.MatMul(h, l.router, nullptr, logits);
  std::vector<float> host(rows * experts);
  b.CopyToHost(host.data(), logits.data, host.size() * sizeof(float));
  std::vector<std::vector<int32_t>> routed(experts);
  std::vector<std::vector<float>> weights(experts);
  std::vector<RoutedExpert> chosen;
  for (int64_t t = 0; t < rows; ++t) {
    chosen.clear();
    RouteToken(host.data() + t * experts, m, &chosen);
    for (const RoutedExpert& r : chosen) {
      routed[r.expert].push_back(static_cast<int32_t>(t));
      weights[r.expert].push_back(r.weight);
    }
  }
  // Each expert over its tokens; outputs added in increasing expert id.
  std::vector<float> zero(rows * hidden, 0.0f);
  b.CopyToDevice(sum.data, zero.data(), zero.size() * sizeof(float));
  const int64_t f = m.expert_intermediate_size;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = static_cast<int64_t>(routed[e].size());
    expert_tokens_[layer][e] += n;
    if (n == 0) continue;
    const DeviceMatrix xe = xin.RowRange(0, n), ye = y.RowRange(0, n);
    const DeviceMatrix gu = gate_up.RowRange(0, n).ColRange(0, 2 * f);
    b.GatherRows(h, routed[e], xe);
    MatMulStacked(xe, l.expert_gate_up[e], nullptr, gu);
    b.SwiGlu(gu.ColRange(0, f), gu.ColRange(f, f), gu.ColRange(0, f));
    b.MatMul(gu.ColRange(0, f), l.expert_down[e], nullptr, ye);
    b.AddScaledRows(ye, routed[e], weights[e], sum);
  }
  if (m.shared_intermediate_size > 0) {
    const int64_t s = m.shared_intermediate_size;
    const DeviceMatrix gu = gate_up.ColRange(0, 2 * s);
    MatMulStacked(h, l.shared_gate_up, nullptr, gu);
    b.SwiGlu(gu.ColRange(0, s), gu.ColRange(s, s), gu.ColRange(0, s));
    b.MatMul(gu.ColRange(0, s), l.shared_down, nullptr, y);
    std::vector<int32_t> all(rows);
    std::vector<float> scale(rows, 1.0f);
    for (int64_t t = 0; t < rows; ++t) all[t] = static_cast<int32_t>(t);
    if (m.shared_expert_gate) {
      b.MatMul(h, l.shared_gate, nullptr, shared_logit);
      std::vector<float> g(rows);
      b.CopyToHost(g.data(), shared_logit.data, rows * sizeof(float));
      for (int64_t t = 0; t < rows; ++t) scale[t] = 1.0f / (1.0f + Exp(-g[t]));
      // sigmoid(g) * out, as HF computes it: the product rounded, then added.
    }
    b.AddScaledRows(y, all, scale, sum);
  }
  if (h.dtype == sum.dtype) {
    b.CopyOnDevice(h.data, sum.data, rows * hidden * sizeof(float));
  } else {  // activations of another type (a GPU backend's bf16): converted row by row
    std::vector<int32_t> every(rows);
    for (int64_t t = 0; t < rows; ++t) every[t] = static_cast<int32_t>(t);
    b.GatherRows(sum, every, h);
  }
  return absl::OkStatus();
}

bool Transformer::RecordableStep(absl::Span<const ForwardSequence> batch,
                                 bool no_input_rows) const {
  if (backend_->max_recorded_rows() <= 0 || tensor_parallel_ != nullptr || !no_input_rows) {
    return false;
  }
  // Mixture-of-experts layers route on the host (a sync per layer): not recordable.
  for (const Layer& l : layers_) {
    if (l.moe) return false;
  }
  for (const ForwardSequence& s : batch) {
    if (s.tokens.size() != 1 || s.all_logits || s.no_logits || s.replay_end > 0 ||
        s.window_floor > 0) {
      return false;
    }
  }
  return true;
}

bool Transformer::PadForRecording(absl::Span<const ForwardSequence> batch, const KvBlockLayout& kl,
                                  const KvBlockPool* window_kv, std::vector<int32_t>* ids,
                                  StepLayout* layout, StepLayout* window_layout,
                                  Backend::StepInputs* inputs) const {
  const int64_t rows =
      RecordedRows(static_cast<int64_t>(batch.size()), backend_->max_recorded_rows());
  if (rows == 0) return false;
  // Each table cut to the blocks its row reaches (a sequence may hold more), then padded.
  StepLayout full = *layout, window;
  if (window_kv != nullptr) window = *window_layout;
  int64_t longest = 0, window_longest = 0;
  for (int64_t r = 0; r < full.rows(); ++r) {
    const int64_t need = kl.BlocksFor(static_cast<int64_t>(full.positions[r]) + 1);
    full.block_tables[r].resize(need);
    longest = std::max(longest, need);
    if (window_kv != nullptr) {
      window.block_tables[r].resize(need);
      window_longest = std::max(window_longest, need);
    }
  }
  const int64_t capacity = TableCapacity(longest);
  const int64_t window_capacity = TableCapacity(window_longest);
  std::vector<int32_t> padded_ids = *ids;
  if (!PadDecodeStep(rows, capacity, window_capacity, &padded_ids, &full,
                     window_kv != nullptr ? &window : nullptr)) {
    return false;
  }
  *ids = std::move(padded_ids);
  *layout = std::move(full);
  if (window_kv != nullptr) *window_layout = std::move(window);
  inputs->max_position =
      static_cast<int32_t>(std::max(capacity, window_capacity) * kl.block_tokens - 1);
  return true;
}

uint64_t Transformer::RecordingKey(int64_t rows, size_t capacity, size_t window_capacity,
                                   const KvBlockPool& kv, const KvBlockPool* window_kv) const {
  // Everything a recorded step's kernels are bound to: its shape and the buffers it reads and
  // writes (the activations, the pools); the weights and tables are the model's for its life.
  const uint64_t parts[] = {
      static_cast<uint64_t>(rows),
      static_cast<uint64_t>(capacity),
      static_cast<uint64_t>(window_capacity),
      static_cast<uint64_t>(kv.layout().block_bytes()),
      reinterpret_cast<uintptr_t>(scratch_.data()),
      static_cast<uint64_t>(scratch_.bytes()),
      reinterpret_cast<uintptr_t>(kv.region().address),
      window_kv != nullptr ? reinterpret_cast<uintptr_t>(window_kv->region().address) : 0,
      window_kv != nullptr ? static_cast<uint64_t>(window_kv->layout().block_bytes()) : 0,
  };
  return Xxh3Hash128(absl::string_view(reinterpret_cast<const char*>(parts), sizeof(parts))).lo;
}

absl::Status Transformer::Forward(absl::Span<const ForwardSequence> batch, KvBlockPool& kv,
                                  std::vector<float>* logits, KvBlockPool* window_kv) {
  const ModelConfig& c = config_;
  const KvBlockLayout& kl = kv.layout();
  auto same = [](const KvBlockLayout& a, const KvBlockLayout& b) {
    return a.num_layers == b.num_layers && a.num_kv_heads == b.num_kv_heads &&
           a.head_dim == b.head_dim && a.dtype == b.dtype && a.block_tokens == b.block_tokens;
  };
  if (window_kv == nullptr) {
    if (!same(kl, KvLayoutFor(kl.block_tokens))) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV pool layout (", kl.DebugString(), ") is not this model's (",
                       KvLayoutFor(kl.block_tokens).DebugString(), ")"));
    }
  } else {
    const KvBlockLayout full = FullKvLayoutFor(kl.block_tokens);
    const KvBlockLayout window = WindowKvLayoutFor(kl.block_tokens);
    if (full.num_layers == 0) {
      return absl::InvalidArgumentError(
          "a window pool needs a model with both sliding-window and full-attention layers");
    }
    if (!same(kl, full) || !same(window_kv->layout(), window)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV pools (", kl.DebugString(), "; ", window_kv->layout().DebugString(),
          ") are not this model's (", full.DebugString(), "; ", window.DebugString(), ")"));
    }
  }
  if (batch.empty()) return absl::InvalidArgumentError("empty batch");
  // The step's layout, validated before anything runs.
  StepLayout layout;
  std::vector<std::vector<BlockId>> window_tables;
  std::vector<int32_t> window_floors;
  bool any_floor = false;
  std::vector<uint8_t> no_write;  // rows of a replay: the full-attention layers' KV stays
  std::vector<int32_t> ids;
  std::vector<int64_t> logit_rows;             // rows of the step whose logits are returned
  std::vector<TokenId*> logit_greedy;          // per logit row: its greedy token alone, or null
  std::vector<InputEmbeddingRows> input_rows;  // offsets: rows of the whole step
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSequence& seq = batch[s];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (seq.all_logits && seq.no_logits) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, ": all_logits and no_logits together"));
    }
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no tokens"));
    if (seq.start_position < 0 || seq.start_position + n > max_positions()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", s, ": positions ", seq.start_position, "..", seq.start_position + n - 1,
          " exceed the model's ", max_positions(), " positions"));
    }
    if (static_cast<int64_t>(seq.blocks.size()) < kl.BlocksFor(seq.start_position + n)) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", seq.blocks.size(),
                                                     " KV blocks cannot hold ",
                                                     seq.start_position + n, " positions"));
    }
    for (BlockId b : seq.blocks) {
      if (b < 0 || b >= kv.num_blocks()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": KV block ", b, " out of range"));
      }
    }
    int64_t covered_rows = 0;  // input_embeddings: sorted, disjoint, inside the step's tokens
    for (const InputEmbeddingRows& e : seq.input_embeddings) {
      if (e.offset < covered_rows || e.rows < 1 || e.offset + e.rows > n || e.data == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": input embedding rows ", e.offset, "+", e.rows,
                         " unsorted, overlapping or outside its ", n, " tokens"));
      }
      covered_rows = e.offset + e.rows;
      input_rows.push_back({layout.rows() + e.offset, e.rows, e.data});
    }
    layout.block_tables.emplace_back(seq.blocks.begin(), seq.blocks.end());
    if (seq.replay_end > 0 || seq.window_floor > 0) {
      if (window_kv == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": a window replay needs a window pool"));
      }
      const int64_t covered = static_cast<int64_t>(seq.blocks.size()) * kl.block_tokens;
      if (seq.window_floor < 0 || seq.window_floor > seq.start_position ||
          seq.replay_end > covered) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": window floor ", seq.window_floor, " or replay end ",
                         seq.replay_end, " outside positions 0..", seq.start_position, " / the ",
                         covered, " the block table holds"));
      }
    }
    if (window_kv != nullptr) {
      // The window blocks every new row needs: from the first key of the widest window.
      const int64_t end = seq.start_position + n;
      if (static_cast<int64_t>(seq.window_blocks.size()) < kl.BlocksFor(end)) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": window blocks cannot hold ", end, " positions"));
      }
      const int64_t first = std::max<int64_t>(
          seq.window_floor, std::max<int64_t>(0, seq.start_position + 1 - max_window()));
      for (int64_t bi = first / kl.block_tokens; bi < kl.BlocksFor(end); ++bi) {
        const BlockId b = seq.window_blocks[bi];
        if (b < 0 || b >= window_kv->num_blocks()) {
          return absl::InvalidArgumentError(
              absl::StrCat("sequence ", s, ": window block ", bi, " is missing or out of range"));
        }
      }
      window_tables.emplace_back(seq.window_blocks.begin(), seq.window_blocks.end());
      window_floors.push_back(static_cast<int32_t>(seq.window_floor));
      if (seq.window_floor > 0) any_floor = true;
    }
    for (int64_t i = 0; i < n; ++i) {
      const TokenId t = seq.tokens[i];
      if (t >= static_cast<TokenId>(c.vocab_size)) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", t, " is outside the vocabulary (", c.vocab_size, ")"));
      }
      if (!seq.no_logits && (seq.all_logits || i == n - 1)) {
        logit_rows.push_back(layout.rows());
        logit_greedy.push_back(seq.all_logits ? nullptr : seq.greedy_token);
      }
      ids.push_back(static_cast<int32_t>(t));
      no_write.push_back(seq.start_position + i < seq.replay_end ? 1 : 0);
      layout.positions.push_back(static_cast<int32_t>(seq.start_position + i));
      layout.row_sequence.push_back(static_cast<int32_t>(s));
    }
  }
  // The window layers' layout: each layer's slot in its own pool, and the window tables.
  StepLayout window_layout;
  if (window_kv != nullptr) {
    window_layout = layout;
    window_layout.block_tables = std::move(window_tables);
    if (any_floor) window_layout.first_keys = std::move(window_floors);
    if (std::find(no_write.begin(), no_write.end(), 1) != no_write.end()) {
      layout.no_write = std::move(no_write);
    }
  }
  const int64_t read_rows = static_cast<int64_t>(logit_rows.size());  // logit rows returned
  Backend& b = *backend_;
  // A decode step the backend can record and replay, in its recorded shape (recorded_step.h).
  Backend::StepInputs recorded;
  const bool record =
      RecordableStep(batch, input_rows.empty()) &&
      PadForRecording(batch, kl, window_kv, &ids, &layout, &window_layout, &recorded);
  if (record) {
    for (int64_t r = read_rows; r < layout.rows(); ++r) logit_rows.push_back(r);
  }
  const int64_t m = layout.rows(), nl = static_cast<int64_t>(logit_rows.size());
  RETURN_IF_ERROR(EnsureScratch(m, nl));

  size_t scratch_bytes = 0;
  const Activations a =
      CarveActivations(static_cast<char*>(scratch_.data()), m, nl, &scratch_bytes);
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const int64_t f = c.intermediate_size;
  const DeviceMatrix &x = a.x, &h = a.h, &qkv = a.qkv, &attn = a.attn, &gate_up = a.gate_up;
  const DeviceMatrix &selected = a.selected, &out = a.out;
  const DeviceMatrix q = qkv.ColRange(0, qd), k = qkv.ColRange(qd, kvd);
  const DeviceMatrix v = qkv.ColRange(qd + kvd, kvd);
  const DeviceMatrix gate = gate_up.ColRange(0, f), up = gate_up.ColRange(f, f);

  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  // The step's kernels, from the embeddings to the logits.
  auto issue = [&]() -> absl::Status {
    b.Embed(embed_, ids, x);
    // Rows given by the caller (an image's embeddings) replace the table's.
    for (const InputEmbeddingRows& e : input_rows) {
      b.CopyToDevice(x.RowRange(e.offset, e.rows).data, e.data,
                     static_cast<size_t>(e.rows * c.hidden_size) * sizeof(float));
    }
    b.RmsNorm(x, layers_[0].attn_norm, eps, h);
    int32_t full_slot = 0, window_slot = 0;
    for (int64_t li = 0; li < c.num_layers; ++li) {
      const Layer& l = layers_[li];
      const bool windowed = window_kv != nullptr && c.window(li) > 0;
      const KvLayerView view = window_kv == nullptr ? kv.LayerView(static_cast<int32_t>(li))
                               : windowed           ? window_kv->LayerView(window_slot++)
                                                    : kv.LayerView(full_slot++);
      const StepLayout& steps = windowed ? window_layout : layout;
      // h holds RmsNorm(x) for this layer's attention.
      MatMulStacked(h, l.qkv, c.attention_bias ? &l.qkv_bias : nullptr, qkv);
      if (c.qk_norm) {
        b.RmsNorm(q, l.q_norm, eps, q);
        b.RmsNorm(k, l.k_norm, eps, k);
      }
      b.Rope(q, static_cast<int32_t>(c.num_heads), layout.positions, rope_);
      b.Rope(k, static_cast<int32_t>(c.num_kv_heads), layout.positions, rope_);
      b.WriteKv(k, v, view, steps);
      b.Attention(q, view, steps, scale, c.window(li), attn);
      b.MatMul(attn, l.o, nullptr, h);
      // Tensor parallel: each rank's o projection covered its heads; the sum is the layer's.
      if (tensor_parallel_ != nullptr) RETURN_IF_ERROR(tensor_parallel_->AllReduceSum(h));
      b.AddRmsNorm(x, h, l.mlp_norm, eps, h);
      if (l.moe) {
        RETURN_IF_ERROR(MoeFfn(li, h));
      } else {
        MatMulStacked(h, l.gate_up, nullptr, gate_up);
        b.SwiGlu(gate, up, gate);
        b.MatMul(gate, l.down, nullptr, h);
        if (tensor_parallel_ != nullptr) RETURN_IF_ERROR(tensor_parallel_->AllReduceSum(h));
      }
      // The residual, and the norm of what comes next: the next layer's, or the final one.
      b.AddRmsNorm(x, h, li + 1 < c.num_layers ? layers_[li + 1].attn_norm : final_norm_, eps, h);
    }
    for (int64_t i = 0; i < nl; ++i) {
      b.CopyOnDevice(selected.RowRange(i, 1).data, h.RowRange(logit_rows[i], 1).data,
                     c.hidden_size * DTypeBytes(h.dtype));
    }
    b.MatMul(selected, *lm_head_, nullptr, out);
    return absl::OkStatus();
  };
  if (!record) {
    RETURN_IF_ERROR(issue());
  } else {
    recorded.ids = &ids;
    recorded.positions = &layout.positions;
    recorded.layouts.push_back(&layout);
    if (window_kv != nullptr) recorded.layouts.push_back(&window_layout);
    recorded.key = RecordingKey(layout.rows(), layout.block_tables[0].size(),
                                window_kv != nullptr ? window_layout.block_tables[0].size() : 0, kv,
                                window_kv);
    Backend::StepMode mode = b.BeginStep(recorded);
    for (;;) {
      // The step is ended even when issuing failed (a capture must not stay open).
      const absl::Status issued = mode != Backend::StepMode::kReplayed ? issue() : absl::OkStatus();
      const absl::StatusOr<bool> ended = b.EndStep(issued.ok());
      RETURN_IF_ERROR(issued);
      RETURN_IF_ERROR(ended.status());
      if (*ended) break;
      mode =
          Backend::StepMode::kEager;  // the recording was dropped: the same kernels, as they come
    }
    ++recorded_steps_;
  }
  const DeviceMatrix returned = out.RowRange(0, read_rows);
  const size_t old = logits->size();
  // Rows whose greedy token alone is wanted: chosen by the backend (on a GPU, only the tokens
  // come back); the other rows' logits are copied, in runs. Without the backend's argmax, all.
  std::vector<int32_t> greedy;
  const bool any_greedy = std::any_of(logit_greedy.begin(), logit_greedy.end(),
                                      [](TokenId* t) { return t != nullptr; });
  if (!any_greedy || !b.ArgMaxRows(returned, &greedy).ok()) {
    logits->resize(old + read_rows * c.vocab_size);
    b.CopyToHost(logits->data() + old, returned.data, read_rows * c.vocab_size * sizeof(float));
  } else {
    int64_t copied = 0;
    for (int64_t i = 0; i < read_rows;) {
      if (logit_greedy[i] != nullptr) {
        *logit_greedy[i] = greedy[i];
        ++i;
        continue;
      }
      int64_t end = i + 1;
      while (end < read_rows && logit_greedy[end] == nullptr) ++end;
      logits->resize(old + (copied + end - i) * c.vocab_size);
      b.CopyToHost(logits->data() + old + copied * c.vocab_size, out.RowRange(i, end - i).data,
                   (end - i) * c.vocab_size * sizeof(float));
      copied += end - i;
      i = end;
    }
  }
  // A device fault anywhere in the step (the CPU backend has none).
  const absl::Status device = b.status();
  if (!device.ok()) {
    logits->resize(old);
    return device;
  }
  return absl::OkStatus();
}

}  // namespace ferry
