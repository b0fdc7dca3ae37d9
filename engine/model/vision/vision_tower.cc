#include "engine/model/vision/vision_tower.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/backends/cpu/cpu_kernels.h"
#include "engine/common/float_math.h"
#include "engine/common/le_encoding.h"
#include "engine/common/status.h"
#include "engine/common/thread_pool.h"
#include "engine/model/host_weights.h"
#include "engine/model/safetensors_file.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::json;

constexpr char kTowerPrefix[] = "vision_tower.vision_model.";
constexpr char kProjectorPrefix[] = "multi_modal_projector.";

// [name -> shape] of every tower (without kTowerPrefix) and projector tensor.
std::map<std::string, std::vector<int64_t>> ExpectedTensors(const VisionConfig& c) {
  const int64_t d = c.hidden_size, i = c.intermediate_size, t = c.text_hidden_size;
  std::map<std::string, std::vector<int64_t>> e;
  e["embeddings.class_embedding"] = {d};
  e["embeddings.patch_embedding.weight"] = {d, c.num_channels, c.patch_size, c.patch_size};
  e["embeddings.position_embedding.weight"] = {c.num_positions(), d};
  for (const char* norm : {"pre_layrnorm", "post_layernorm"}) {
    e[absl::StrCat(norm, ".weight")] = {d};
    e[absl::StrCat(norm, ".bias")] = {d};
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("encoder.layers.", l, ".");
    for (const char* norm : {"layer_norm1", "layer_norm2"}) {
      e[p + norm + ".weight"] = {d};
      e[p + norm + ".bias"] = {d};
    }
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
      e[p + "self_attn." + proj + ".weight"] = {d, d};
      e[p + "self_attn." + proj + ".bias"] = {d};
    }
    e[p + "mlp.fc1.weight"] = {i, d};
    e[p + "mlp.fc1.bias"] = {i};
    e[p + "mlp.fc2.weight"] = {d, i};
    e[p + "mlp.fc2.bias"] = {d};
  }
  e[std::string(kProjectorPrefix) + "linear_1.weight"] = {t, d};
  e[std::string(kProjectorPrefix) + "linear_1.bias"] = {t};
  e[std::string(kProjectorPrefix) + "linear_2.weight"] = {t, t};
  e[std::string(kProjectorPrefix) + "linear_2.bias"] = {t};
  return e;
}

// The safetensors files of DIR: model.safetensors, or the shards of its index.
absl::StatusOr<std::vector<std::string>> WeightFiles(const std::string& dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return std::vector<std::string>{dir + "/model.safetensors"};
  std::set<std::string> shards;
  try {
    const Json index = Json::parse(in);
    for (auto it = index.at("weight_map").begin(); it != index.at("weight_map").end(); ++it) {
      shards.insert(it.value().get<std::string>());
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", e.what()));
  }
  std::vector<std::string> files;
  for (const std::string& s : shards) {
    if (s.empty() || s.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": shard '", s, "' is not a file name in the directory"));
    }
    files.push_back(dir + "/" + s);
  }
  return files;
}

Hash128 Digest(const VisionConfig& c, VisionPrecision precision,
               const std::map<std::string, std::vector<float>>& tensors,
               const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::string out = "FERRYVT1";
  AppendLengthPrefixed(
      &out, absl::StrCat("image_size=", c.image_size, " patch_size=", c.patch_size,
                         " channels=", c.num_channels, " hidden=", c.hidden_size, " intermediate=",
                         c.intermediate_size, " layers=", c.num_layers, " heads=", c.num_heads,
                         " eps=", c.layer_norm_eps, " act=", VisionActivationName(c.hidden_act),
                         " feature_layer=", c.selected_layer(), " keep_cls=", c.keep_cls,
                         " projector_act=", VisionActivationName(c.projector_act),
                         " text_hidden=", c.text_hidden_size,
                         // fp32 adds nothing: its digests predate the bf16 variant.
                         precision == VisionPrecision::kBf16 ? " precision=bf16" : ""));
  AppendU32Le(&out, static_cast<uint32_t>(tensors.size()));
  for (const auto& [name, values] : tensors) {  // sorted by name
    AppendLengthPrefixed(&out, name);
    const std::vector<int64_t>& shape = shapes.at(name);
    AppendU32Le(&out, static_cast<uint32_t>(shape.size()));
    for (int64_t dim : shape) AppendU64Le(&out, static_cast<uint64_t>(dim));
    AppendHash128Le(&out,
                    Xxh3Hash128(absl::string_view(reinterpret_cast<const char*>(values.data()),
                                                  values.size() * sizeof(float))));
  }
  return Xxh3Hash128(out);
}

// Work items of a product, as the CPU backend's MatMul cuts them: up to kRowsPerItem rows, and
// groups of column panels whose packed weights fit in about kPanelBytes (a multiple of 3 panels,
// the kernels' tile), consecutive items walking the row blocks of one group so that it stays in
// the L2 cache.
constexpr int64_t kRowsPerItem = 48;
constexpr int64_t kPanelBytes = 256 * 1024;

// y[r, o] = b[o] + sum_k x[r, k] w[o, k] over `w` (packed, fp32 or bf16: VisionTower::Matrix),
// spread over the shared pool; then the bias. fp32: the CPU backend's fp32 product (one
// accumulator per output element, a fused multiply-add per k in increasing order, whatever the
// instruction set). bf16: x's rows rounded to bf16 (round_bf16) and the bf16 product, as the
// backend's bf16 MatMul. Either way each output element is computed by one thread in a fixed
// order, so the result does not depend on the thread count or the item boundaries.
std::vector<float> Linear(const CpuKernels& kernels, const std::vector<float>& x, int64_t rows,
                          int64_t in, const VisionTower::Matrix& w, const std::vector<float>& b,
                          int64_t out) {
  ThreadPool& pool = ThreadPool::Shared();
  std::vector<float> y(static_cast<size_t>(rows * out));
  const bool bf16 = !w.bf16.empty();
  const int64_t k2 = PairedK(in);
  const int64_t panels = (out + kPanel - 1) / kPanel;
  const int64_t row_blocks = (rows + kRowsPerItem - 1) / kRowsPerItem;
  std::vector<uint16_t> xb;
  if (bf16) {
    xb.resize(static_cast<size_t>(rows * k2));
    pool.ParallelFor(static_cast<size_t>(row_blocks), [&](size_t rb) {
      const int64_t m0 = static_cast<int64_t>(rb) * kRowsPerItem;
      const int64_t m1 = std::min(rows, m0 + kRowsPerItem);
      for (int64_t m = m0; m < m1; ++m) kernels.round_bf16(x.data() + m * in, in, &xb[m * k2]);
    });
  }
  const int64_t panel_bytes = kPanel * (bf16 ? k2 * 2 : in * 4);
  const int64_t by_cache = std::max<int64_t>(1, kPanelBytes / panel_bytes);
  // At least the kernels' 3-panel tile: narrower tiles (the fp32 fc2 of a 3072-wide MLP would
  // get one panel) reload the activations for every panel; 3 such panels still fit this
  // generation's L2 caches (1-2 MiB).
  const int64_t group = std::max<int64_t>(3, by_cache - by_cache % 3);
  const int64_t groups = (panels + group - 1) / group;
  pool.ParallelFor(static_cast<size_t>(groups * row_blocks), [&](size_t item) {
    const int64_t g = static_cast<int64_t>(item) / row_blocks;
    const int64_t m0 = static_cast<int64_t>(item) % row_blocks * kRowsPerItem;
    const int64_t p0 = g * group, p1 = std::min(panels, p0 + group);
    const int64_t m = std::min(kRowsPerItem, rows - m0);
    if (bf16) {
      kernels.gemm_bf16(xb.data() + m0 * k2, k2, m, k2, w.bf16.data(), p0, p1, out,
                        y.data() + m0 * out, out);
    } else {
      kernels.gemm_f32(x.data() + m0 * in, in, m, in, w.f32.data(), p0, p1, out,
                       y.data() + m0 * out, out);
    }
    const int64_t c1 = std::min(out, p1 * kPanel);
    for (int64_t r = m0; r < m0 + m; ++r) {
      for (int64_t c = p0 * kPanel; c < c1; ++c) y[r * out + c] += b[c];
    }
  });
  return y;
}

// LayerNorm over each row of `width` (biased variance, statistics in double), into `out`; rows
// spread over the shared pool (each row by one thread, in a fixed order).
void LayerNorm(const std::vector<float>& x, int64_t rows, int64_t width,
               const std::vector<float>& w, const std::vector<float>& b, double eps,
               std::vector<float>& out) {
  out.resize(x.size());
  constexpr int64_t kRows = 16;
  ThreadPool::Shared().ParallelFor(static_cast<size_t>((rows + kRows - 1) / kRows), [&](size_t i) {
    const int64_t r1 = std::min(rows, static_cast<int64_t>(i + 1) * kRows);
    for (int64_t r = static_cast<int64_t>(i) * kRows; r < r1; ++r) {
      const float* xr = x.data() + r * width;
      double mean = 0;
      for (int64_t k = 0; k < width; ++k) mean += xr[k];
      mean /= static_cast<double>(width);
      double var = 0;
      for (int64_t k = 0; k < width; ++k) var += (xr[k] - mean) * (xr[k] - mean);
      var /= static_cast<double>(width);
      const double inv = 1.0 / std::sqrt(var + eps);
      float* yr = out.data() + r * width;
      for (int64_t k = 0; k < width; ++k) {
        yr[k] = static_cast<float>((xr[k] - mean) * inv) * w[k] + b[k];
      }
    }
  });
}

void ActivateRange(VisionActivation act, float* x, size_t n) {
  for (size_t e = 0; e < n; ++e) {
    float& v = x[e];
    switch (act) {
      case VisionActivation::kQuickGelu:
        v = v / (1.0f + std::exp(-1.702f * v));
        break;
      case VisionActivation::kGelu:
        v = 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f));
        break;
      case VisionActivation::kGeluTanh: {
        const float inner = 0.79788456080286536f * (v + 0.044715f * v * v * v);
        v = 0.5f * v * (1.0f + std::tanh(inner));
        break;
      }
    }
  }
}

// The activation, element by element, in chunks over the shared pool.
void Activate(VisionActivation act, std::vector<float>& x) {
  constexpr size_t kChunk = 16384;
  ThreadPool::Shared().ParallelFor((x.size() + kChunk - 1) / kChunk, [&](size_t i) {
    ActivateRange(act, x.data() + i * kChunk, std::min(kChunk, x.size() - i * kChunk));
  });
}

// The bf16 variant's activation: quick_gelu as the kernels' vectorised silu_mul,
// x sigmoid(1.702 x) = silu(1.702 x) / 1.702 (within an ulp or two of Activate's, which uses
// std::exp); the others as Activate.
void ActivateBf16Variant(const CpuKernels& kern, VisionActivation act, std::vector<float>& x) {
  if (act != VisionActivation::kQuickGelu) return Activate(act, x);
  constexpr size_t kChunk = 16384;
  const std::vector<float> inverse(kChunk, 1.0f / 1.702f);
  ThreadPool::Shared().ParallelFor((x.size() + kChunk - 1) / kChunk, [&](size_t i) {
    float* xi = x.data() + i * kChunk;
    const size_t n = std::min(kChunk, x.size() - i * kChunk);
    std::vector<float> g(n);
    for (size_t e = 0; e < n; ++e) g[e] = 1.702f * xi[e];
    kern.silu_mul(g.data(), inverse.data(), xi, static_cast<int64_t>(n));
  });
}

// x += y, in chunks over the shared pool.
void AddInPlace(std::vector<float>& x, const std::vector<float>& y) {
  constexpr size_t kChunk = 16384;
  ThreadPool::Shared().ParallelFor((x.size() + kChunk - 1) / kChunk, [&](size_t i) {
    const size_t e1 = std::min(x.size(), (i + 1) * kChunk);
    for (size_t e = i * kChunk; e < e1; ++e) x[e] += y[e];
  });
}

// Attention of the bf16 variant as two bf16 products per head: scores = Q K^T with each head's
// keys packed as the product's weights (n outputs of head_dim), softmax in fp32 (scale_max,
// exp_sum, a multiplication by 1 / sum), then out = P V with the probabilities rounded to bf16 and
// each head's values packed transposed (head_dim outputs of n). q, k, v: n x d (heads of hd = d /
// heads side by side); attn receives n x d.
void AttentionBf16(const CpuKernels& kern, const std::vector<float>& q, const std::vector<float>& k,
                   const std::vector<float>& v, int64_t n, int64_t d, int64_t heads, float scale,
                   std::vector<float>& attn) {
  const int64_t hd = d / heads, hd2 = PairedK(hd), n2 = PairedK(n);
  const int64_t key_elems = PackedElementsBf16(n, hd), value_elems = PackedElementsBf16(hd, n);
  std::vector<uint16_t> keys(static_cast<size_t>(heads * key_elems));
  std::vector<uint16_t> values(static_cast<size_t>(heads * value_elems));
  ThreadPool& pool = ThreadPool::Shared();
  pool.ParallelFor(static_cast<size_t>(heads), [&](size_t head) {
    const int64_t hh = static_cast<int64_t>(head);
    std::vector<uint16_t> rows(static_cast<size_t>(std::max(n * hd, hd * n)));
    std::vector<uint16_t> row(static_cast<size_t>(hd2));  // round_bf16 pads to even
    for (int64_t j = 0; j < n; ++j) {
      kern.round_bf16(k.data() + j * d + hh * hd, hd, row.data());
      std::copy(row.begin(), row.begin() + hd, rows.begin() + j * hd);
    }
    PackPanelsBf16(rows.data(), n, hd, keys.data() + hh * key_elems);
    for (int64_t e = 0; e < hd; ++e) {
      for (int64_t j = 0; j < n; ++j) rows[e * n + j] = FloatToBf16(v[j * d + hh * hd + e]);
    }
    PackPanelsBf16(rows.data(), hd, n, values.data() + hh * value_elems);
  });
  constexpr int64_t kQueries = 48;
  const int64_t blocks = (n + kQueries - 1) / kQueries;
  const int64_t key_panels = (n + kPanel - 1) / kPanel, value_panels = (hd + kPanel - 1) / kPanel;
  pool.ParallelFor(static_cast<size_t>(blocks * heads), [&](size_t task) {
    const int64_t i0 = static_cast<int64_t>(task) / heads * kQueries;
    const int64_t hh = static_cast<int64_t>(task) % heads;
    const int64_t rows = std::min(kQueries, n - i0);
    std::vector<uint16_t> qb(static_cast<size_t>(rows * hd2));
    for (int64_t r = 0; r < rows; ++r) {
      kern.round_bf16(q.data() + (i0 + r) * d + hh * hd, hd, qb.data() + r * hd2);
    }
    std::vector<float> s(static_cast<size_t>(rows * n));
    kern.gemm_bf16(qb.data(), hd2, rows, hd2, keys.data() + hh * key_elems, 0, key_panels, n,
                   s.data(), n);
    std::vector<uint16_t> pb(static_cast<size_t>(rows * n2));
    for (int64_t r = 0; r < rows; ++r) {
      float* sr = s.data() + r * n;
      const float max = kern.scale_max(sr, n, scale);
      const float sum = kern.exp_sum(sr, n, max);
      kern.scale_max(sr, n, 1.0f / sum);  // vectorised: x / sum within an ulp, before bf16
      kern.round_bf16(sr, n, pb.data() + r * n2);
    }
    kern.gemm_bf16(pb.data(), n2, rows, n2, values.data() + hh * value_elems, 0, value_panels, hd,
                   attn.data() + i0 * d + hh * hd, d);
  });
}

}  // namespace

absl::StatusOr<VisionTower> VisionTower::Load(const std::string& dir, VisionPrecision precision) {
  VisionTower tower;
  tower.precision_ = precision;
  ASSIGN_OR_RETURN(tower.config_, ReadVisionConfig(dir));
  const VisionConfig& c = tower.config_;
  const auto expected = ExpectedTensors(c);
  ASSIGN_OR_RETURN(const std::vector<std::string> files, WeightFiles(dir));
  std::vector<std::unique_ptr<SafetensorsFile>> open_files;  // mapped until converted
  std::map<std::string, HostTensor> host;
  std::vector<model_internal::ConversionJob> jobs;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> st, SafetensorsFile::Open(file));
    for (auto it = st->header().begin(); it != st->header().end(); ++it) {
      std::string name = it.key();
      if (absl::StartsWith(name, kTowerPrefix)) {
        name = name.substr(sizeof(kTowerPrefix) - 1);
        // A buffer older checkpoints saved; the positions are 0..n-1 whatever it holds.
        if (name == "embeddings.position_ids") continue;
      } else if (!absl::StartsWith(name, kProjectorPrefix)) {
        continue;  // the text model's, or __metadata__
      }
      auto want = expected.find(name);
      if (want == expected.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": unexpected tensor '", it.key(), "'"));
      }
      HostTensor tensor;
      try {
        tensor.shape = it.value().at("shape").get<std::vector<int64_t>>();
      } catch (const Json::exception& e) {
        return absl::InvalidArgumentError(
            absl::StrCat(file, ": tensor '", it.key(), "': ", e.what()));
      }
      if (tensor.shape != want->second) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": tensor '", it.key(), "' has shape [", absl::StrJoin(tensor.shape, ", "),
            "], config.json implies [", absl::StrJoin(want->second, ", "), "]"));
      }
      const std::string dtype =
          it.value().is_object() ? it.value().value("dtype", std::string("?")) : "?";
      auto type = GgmlTypeOfSafetensors(dtype);
      if (!type.ok()) {
        return absl::Status(type.status().code(), absl::StrCat(file, ": tensor '", it.key(),
                                                               "': ", type.status().message()));
      }
      ASSIGN_OR_RETURN(const absl::string_view data, st->Data(it.key(), it.value()));
      tensor.dtype = WeightDType::kF32;
      auto [entry, inserted] = host.emplace(name, std::move(tensor));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", it.key(), "' twice"));
      }
      jobs.push_back({absl::StrCat(file, ": tensor '", it.key(), "'"), *type,
                      reinterpret_cast<const uint8_t*>(data.data()), data.size(), &entry->second});
    }
    open_files.push_back(std::move(st));
  }
  for (const auto& [name, shape] : expected) {
    if (host.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": missing tensor ",
                       absl::StartsWith(name, kProjectorPrefix) ? "" : kTowerPrefix, name));
    }
  }
  RETURN_IF_ERROR(model_internal::ConvertTensors(jobs));
  ASSIGN_OR_RETURN(const CpuIsa isa, SelectCpuIsa());
  tower.kernels_ = &CpuKernelsFor(isa);
  for (auto& [name, tensor] : host) tower.tensors_.emplace(name, std::move(tensor.f32));
  tower.digest_ = Digest(c, precision, tower.tensors_, expected);
  // The matrices (the patch embedding as D x C*p*p) packed for the product, the rest as read.
  for (auto it = tower.tensors_.begin(); it != tower.tensors_.end();) {
    const std::vector<int64_t>& shape = expected.at(it->first);
    if (shape.size() < 2) {
      ++it;
      continue;
    }
    if (absl::StrContains(it->first, "position_embedding")) {  // added, not multiplied
      ++it;
      continue;
    }
    const int64_t n = shape[0], k = static_cast<int64_t>(it->second.size()) / n;
    Matrix m;
    if (precision == VisionPrecision::kBf16) {
      // Rounded to bf16 (to nearest even) row by row, then packed for gemm_bf16.
      std::vector<uint16_t> rounded(static_cast<size_t>(n * k));
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t e = 0; e < k; ++e) rounded[r * k + e] = FloatToBf16(it->second[r * k + e]);
      }
      m.bf16.resize(static_cast<size_t>(PackedElementsBf16(n, k)));
      PackPanelsBf16(rounded.data(), n, k, m.bf16.data());
    } else {
      m.f32.resize(static_cast<size_t>(PackedElements(n, k)));
      PackPanels(it->second.data(), n, k, m.f32.data());
    }
    tower.packed_.emplace(it->first, std::move(m));
    it = tower.tensors_.erase(it);
  }
  return tower;
}

const std::vector<float>& VisionTower::T(const std::string& name) const {
  return tensors_.at(name);
}

const VisionTower::Matrix& VisionTower::P(const std::string& name) const {
  return packed_.at(name);
}

void VisionTower::EncoderLayer(int64_t layer, std::vector<float>& x) const {
  const VisionConfig& c = config_;
  const int64_t n = c.num_positions(), d = c.hidden_size, heads = c.num_heads, hd = c.head_dim();
  const std::string p = absl::StrCat("encoder.layers.", layer, ".");
  std::vector<float> h;
  LayerNorm(x, n, d, T(p + "layer_norm1.weight"), T(p + "layer_norm1.bias"), c.layer_norm_eps, h);
  const std::vector<float> q = Linear(*kernels_, h, n, d, P(p + "self_attn.q_proj.weight"),
                                      T(p + "self_attn.q_proj.bias"), d);
  const std::vector<float> k = Linear(*kernels_, h, n, d, P(p + "self_attn.k_proj.weight"),
                                      T(p + "self_attn.k_proj.bias"), d);
  const std::vector<float> v = Linear(*kernels_, h, n, d, P(p + "self_attn.v_proj.weight"),
                                      T(p + "self_attn.v_proj.bias"), d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> attn(static_cast<size_t>(n * d));
  const CpuKernels& kern = *kernels_;
  if (precision_ == VisionPrecision::kBf16) {
    AttentionBf16(kern, q, k, v, n, d, heads, scale, attn);
  } else {
    // The keys of each head transposed (head_dim rows of n), as the attention kernels read them.
    std::vector<float> kt(static_cast<size_t>(n * d));
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t e = 0; e < d; ++e) kt[(e / hd) * hd * n + (e % hd) * n + j] = k[j * d + e];
    }
    // One task per (block of up to 16 query positions, head): the CPU kernels' dot products with
    // every key, softmax (scale_max, exp_sum), then the weighted sum of the values.
    constexpr int64_t kQueries = 16;
    const int64_t blocks = (n + kQueries - 1) / kQueries;
    ThreadPool::Shared().ParallelFor(static_cast<size_t>(blocks * heads), [&](size_t task) {
      const int64_t i0 = static_cast<int64_t>(task) / heads * kQueries;
      const int64_t hh = static_cast<int64_t>(task) % heads;
      const int64_t rows = std::min(kQueries, n - i0);
      std::vector<float> s(static_cast<size_t>(rows * n));
      kern.dot_columns_f32(q.data() + i0 * d + hh * hd, d, rows, kt.data() + hh * hd * n, n, hd, n,
                           s.data(), n);
      for (int64_t r = 0; r < rows; ++r) {
        float* sr = s.data() + r * n;
        const float max = kern.scale_max(sr, n, scale);
        const float sum = kern.exp_sum(sr, n, max);
        for (int64_t j = 0; j < n; ++j) sr[j] /= sum;
      }
      float* out = attn.data() + i0 * d + hh * hd;
      for (int64_t r = 0; r < rows; ++r) std::fill(out + r * d, out + r * d + hd, 0.0f);
      kern.weighted_rows_f32(s.data(), n, rows, v.data() + hh * hd, d, n, hd, out, d);
    });
  }
  const std::vector<float> o = Linear(*kernels_, attn, n, d, P(p + "self_attn.out_proj.weight"),
                                      T(p + "self_attn.out_proj.bias"), d);
  AddInPlace(x, o);
  LayerNorm(x, n, d, T(p + "layer_norm2.weight"), T(p + "layer_norm2.bias"), c.layer_norm_eps, h);
  std::vector<float> m = Linear(*kernels_, h, n, d, P(p + "mlp.fc1.weight"), T(p + "mlp.fc1.bias"),
                                c.intermediate_size);
  if (precision_ == VisionPrecision::kBf16) {
    ActivateBf16Variant(kern, c.hidden_act, m);
  } else {
    Activate(c.hidden_act, m);
  }
  const std::vector<float> f = Linear(*kernels_, m, n, c.intermediate_size, P(p + "mlp.fc2.weight"),
                                      T(p + "mlp.fc2.bias"), d);
  AddInPlace(x, f);
}

absl::StatusOr<std::vector<float>> VisionTower::HiddenState(absl::Span<const float> pixels,
                                                            int64_t layer) const {
  const VisionConfig& c = config_;
  if (static_cast<int64_t>(pixels.size()) != c.pixel_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("vision tower: ", pixels.size(), " pixel values for a ", c.num_channels, "x",
                     c.image_size, "x", c.image_size, " image (", c.pixel_count(), ")"));
  }
  if (layer < 0 || layer > c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("vision tower: hidden state ", layer, " of 0..", c.num_layers));
  }
  const int64_t d = c.hidden_size, ps = c.patch_size, side = c.patches_per_side(),
                n = c.num_positions(), s = c.image_size;
  const int64_t unfolded = c.num_channels * ps * ps;
  // The patches unfolded in the conv weight's (channel, row, column) order, one row each.
  std::vector<float> patches(static_cast<size_t>(c.num_patches() * unfolded));
  for (int64_t py = 0; py < side; ++py) {
    for (int64_t px = 0; px < side; ++px) {
      float* row = patches.data() + (py * side + px) * unfolded;
      for (int64_t ch = 0; ch < c.num_channels; ++ch) {
        for (int64_t ky = 0; ky < ps; ++ky) {
          const float* src = pixels.data() + (ch * s + py * ps + ky) * s + px * ps;
          std::copy(src, src + ps, row + (ch * ps + ky) * ps);
        }
      }
    }
  }
  const std::vector<float> no_bias(static_cast<size_t>(d), 0.0f);  // CLIP's conv has none
  const std::vector<float> embedded = Linear(*kernels_, patches, c.num_patches(), unfolded,
                                             P("embeddings.patch_embedding.weight"), no_bias, d);
  std::vector<float> x(static_cast<size_t>(n * d));
  const std::vector<float>& cls = T("embeddings.class_embedding");
  const std::vector<float>& pos = T("embeddings.position_embedding.weight");
  for (int64_t t = 0; t < d; ++t) x[t] = cls[t] + pos[t];
  for (int64_t i = 1; i < n; ++i) {
    for (int64_t t = 0; t < d; ++t) x[i * d + t] = embedded[(i - 1) * d + t] + pos[i * d + t];
  }
  std::vector<float> h;
  LayerNorm(x, n, d, T("pre_layrnorm.weight"), T("pre_layrnorm.bias"), c.layer_norm_eps, h);
  for (int64_t l = 0; l < layer; ++l) EncoderLayer(l, h);
  return h;
}

std::vector<float> VisionTower::Project(const std::vector<float>& features, int64_t rows) const {
  const VisionConfig& c = config_;
  const std::string p = kProjectorPrefix;
  std::vector<float> h = Linear(*kernels_, features, rows, c.hidden_size, P(p + "linear_1.weight"),
                                T(p + "linear_1.bias"), c.text_hidden_size);
  Activate(c.projector_act, h);
  return Linear(*kernels_, h, rows, c.text_hidden_size, P(p + "linear_2.weight"),
                T(p + "linear_2.bias"), c.text_hidden_size);
}

absl::StatusOr<std::vector<float>> VisionTower::Encode(absl::Span<const float> pixels) const {
  const VisionConfig& c = config_;
  ASSIGN_OR_RETURN(std::vector<float> h, HiddenState(pixels, c.selected_layer()));
  if (!c.keep_cls) h.erase(h.begin(), h.begin() + c.hidden_size);  // "default": CLS dropped
  return Project(h, c.num_image_tokens());
}

}  // namespace ferry
