#include "engine/model/host_weights.h"

#include <chrono>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"
#include "engine/common/thread_pool.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/dequantize.h"

namespace ferry {

int64_t HostTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const char* WeightDTypeName(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kF32:
      return "f32";
    case WeightDType::kBF16:
      return "bf16";
    case WeightDType::kNative:
      return "native";
  }
  return "?";
}

absl::StatusOr<WeightDType> ParseWeightDType(const std::string& name) {
  for (WeightDType d : {WeightDType::kF32, WeightDType::kBF16, WeightDType::kNative}) {
    if (name == WeightDTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("weights '", name, "' is not one of f32, bf16, native"));
}

namespace model_internal {

std::map<std::string, std::vector<int64_t>> ExpectedTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  std::map<std::string, std::vector<int64_t>> t = {
      {"model.embed_tokens.weight", {c.vocab_size, h}},
      {"model.norm.weight", {h}},
  };
  if (!c.tie_word_embeddings) t["lm_head.weight"] = {c.vocab_size, h};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t[p + "input_layernorm.weight"] = {h};
    t[p + "post_attention_layernorm.weight"] = {h};
    t[p + "self_attn.q_proj.weight"] = {q, h};
    t[p + "self_attn.k_proj.weight"] = {kv, h};
    t[p + "self_attn.v_proj.weight"] = {kv, h};
    t[p + "self_attn.o_proj.weight"] = {h, q};
    if (c.moe.sparse(l)) {
      const MoeConfig& m = c.moe;
      const int64_t f = m.expert_intermediate_size;
      t[p + "mlp.gate.weight"] = {m.num_experts, h};
      for (int64_t e = 0; e < m.num_experts; ++e) {
        const std::string x = absl::StrCat(p, "mlp.experts.", e, ".");
        t[x + "gate_proj.weight"] = {f, h};
        t[x + "up_proj.weight"] = {f, h};
        t[x + "down_proj.weight"] = {h, f};
      }
      if (m.shared_intermediate_size > 0) {
        const int64_t s = m.shared_intermediate_size;
        t[p + "mlp.shared_expert.gate_proj.weight"] = {s, h};
        t[p + "mlp.shared_expert.up_proj.weight"] = {s, h};
        t[p + "mlp.shared_expert.down_proj.weight"] = {h, s};
      }
      if (m.shared_expert_gate) t[p + "mlp.shared_expert_gate.weight"] = {1, h};
    } else {
      t[p + "mlp.gate_proj.weight"] = {c.intermediate_size, h};
      t[p + "mlp.up_proj.weight"] = {c.intermediate_size, h};
      t[p + "mlp.down_proj.weight"] = {h, c.intermediate_size};
    }
    if (c.attention_bias) {
      t[p + "self_attn.q_proj.bias"] = {q};
      t[p + "self_attn.k_proj.bias"] = {kv};
      t[p + "self_attn.v_proj.bias"] = {kv};
    }
    if (c.qk_norm) {
      t[p + "self_attn.q_norm.weight"] = {c.head_dim};
      t[p + "self_attn.k_norm.weight"] = {c.head_dim};
    }
  }
  return t;
}

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

absl::Status FinishLoad(ModelFingerprintBuilder& fingerprint, const std::string& kv_dtype,
                        WeightDType dtype, double start_seconds, HostWeights* weights) {
  const ModelConfig& c = weights->config;
  fingerprint.SetKvLayout(KvLayout{kv_dtype, static_cast<uint32_t>(c.num_layers),
                                   static_cast<uint32_t>(c.num_kv_heads),
                                   static_cast<uint32_t>(c.head_dim)});
  if (dtype == WeightDType::kNative) {
    // The formats the matrices are computed in: KV computed from them never meets KV from the
    // same file's bf16 or f32 weights (different arithmetic, different bits).
    std::set<std::string> formats;
    for (const auto& [name, t] : weights->tensors) {
      if (t.quant != WeightQuant::kNone) {
        formats.insert(WeightQuantName(t.quant));
      } else if (t.shape.size() == 2) {
        formats.insert(WeightDTypeName(t.dtype));
      }
    }
    weights->weight_dtype = absl::StrCat("native:", absl::StrJoin(formats, ","));
  } else {
    weights->weight_dtype = WeightDTypeName(dtype);
  }
  fingerprint.SetWeightDtype(weights->weight_dtype);
  ASSIGN_OR_RETURN(weights->fingerprint, fingerprint.Finish());
  weights->kv_dtype = kv_dtype;
  weights->load_seconds = SteadySeconds() - start_seconds;
  return absl::OkStatus();
}

namespace {

template <typename T>
void UnpermuteRows(std::vector<T>& data, int64_t heads, int64_t rows, int64_t cols) {
  const int64_t d = rows / heads, half = d / 2;
  std::vector<T> out(data.size());
  for (int64_t hd = 0; hd < heads; ++hd) {
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t j = 0; j < half; ++j) {
        const int64_t hf_row = hd * d + t * half + j;
        const int64_t gguf_row = hd * d + 2 * j + t;
        std::memcpy(&out[hf_row * cols], &data[gguf_row * cols], cols * sizeof(T));
      }
    }
  }
  data.swap(out);
}

}  // namespace

absl::Status ConvertTensors(const std::vector<ConversionJob>& jobs) {
  struct Range {
    size_t job;
    uint64_t first_block, last_block;
  };
  constexpr uint64_t kRangeElements = 256 * 1024;
  std::vector<Range> ranges;
  std::vector<uint64_t> block_elements(jobs.size()), block_bytes(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const ConversionJob& job = jobs[j];
    const size_t n = static_cast<size_t>(job.out->elements());
    if (absl::Status s = CheckDequantize(job.type, job.size, n); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(job.source, ": ", s.message()));
    }
    GgmlBlockLayout(job.type, &block_elements[j], &block_bytes[j]);
    if (job.out->quant != WeightQuant::kNone) {
      job.out->blocks.assign(job.data, job.data + job.size);  // kept as stored; rows below
      continue;
    }
    if (job.out->dtype == WeightDType::kF32) {
      job.out->f32.resize(n);
    } else {
      job.out->bf16.resize(n);
    }
    const uint64_t blocks = n / block_elements[j];
    const uint64_t per_range = std::max<uint64_t>(1, kRangeElements / block_elements[j]);
    for (uint64_t b = 0; b < blocks; b += per_range) {
      ranges.push_back({j, b, std::min(blocks, b + per_range)});
    }
  }
  // Checked above, so conversions cannot fail; nested pool calls inside run inline.
  ThreadPool::Shared().ParallelFor(ranges.size(), [&](size_t r) {
    const Range& range = ranges[r];
    const ConversionJob& job = jobs[range.job];
    const uint64_t be = block_elements[range.job], bb = block_bytes[range.job];
    const uint8_t* src = job.data + range.first_block * bb;
    const size_t bytes = (range.last_block - range.first_block) * bb;
    const size_t n = (range.last_block - range.first_block) * be;
    absl::Status s =
        job.out->dtype == WeightDType::kF32
            ? DequantizeToF32(job.type, src, bytes, n, job.out->f32.data() + range.first_block * be)
            : DequantizeToBf16(job.type, src, bytes, n,
                               job.out->bf16.data() + range.first_block * be);
    s.IgnoreError();
  });
  ThreadPool::Shared().ParallelFor(jobs.size(), [&](size_t j) {
    const ConversionJob& job = jobs[j];
    if (job.permute_heads == 0) return;
    HostTensor& t = *job.out;
    if (t.quant != WeightQuant::kNone) {
      // Whole rows of blocks move: a row is shape[1] / block elements.
      UnpermuteRows(t.blocks, job.permute_heads, t.shape[0],
                    t.shape[1] / static_cast<int64_t>(block_elements[j]) *
                        static_cast<int64_t>(block_bytes[j]));
    } else if (t.dtype == WeightDType::kF32) {
      UnpermuteRows(t.f32, job.permute_heads, t.shape[0], t.shape[1]);
    } else {
      UnpermuteRows(t.bf16, job.permute_heads, t.shape[0], t.shape[1]);
    }
  });
  return absl::OkStatus();
}

}  // namespace model_internal
}  // namespace ferry
