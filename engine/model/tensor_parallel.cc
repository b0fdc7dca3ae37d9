#include "engine/model/tensor_parallel.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/hash128.h"
#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"
#include "engine/model/dequantize.h"

namespace ferry {
namespace {

// Bytes per row of a matrix tensor, and the values one block holds (1 for f32/bf16).
struct RowFormat {
  int64_t row_bytes = 0;
  int64_t block_elements = 1;
  int64_t block_bytes = 0;
};

absl::StatusOr<RowFormat> FormatOf(const HostTensor& t, const std::string& name) {
  RowFormat f;
  const int64_t cols = t.shape.back();
  if (t.quant == WeightQuant::kNone) {
    f.block_bytes = t.dtype == WeightDType::kF32 ? 4 : 2;
    f.row_bytes = cols * f.block_bytes;
    return f;
  }
  const uint32_t type = GgmlTypeOfWeightQuant(t.quant);
  // The smallest whole number of blocks: 256 values for the K-quants, 32 for the others.
  for (int64_t e : {32, 256}) {
    const size_t bytes = GgmlDataSize(type, e);
    if (bytes > 0) {
      f.block_elements = e;
      f.block_bytes = static_cast<int64_t>(bytes);
      break;
    }
  }
  if (f.block_bytes == 0 || cols % f.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": cannot split its blocks"));
  }
  f.row_bytes = cols / f.block_elements * f.block_bytes;
  return f;
}

// Rows [begin, begin + count) of a matrix, or elements of a vector.
absl::StatusOr<HostTensor> SliceRows(const HostTensor& t, int64_t begin, int64_t count,
                                     const std::string& name) {
  HostTensor out;
  out.dtype = t.dtype;
  out.quant = t.quant;
  out.shape = t.shape;
  out.shape[0] = count;
  const int64_t per_row = t.shape.size() == 2 ? t.shape[1] : 1;
  if (t.quant == WeightQuant::kNone) {
    if (t.dtype == WeightDType::kF32) {
      out.f32.assign(t.f32.begin() + begin * per_row, t.f32.begin() + (begin + count) * per_row);
    } else {
      out.bf16.assign(t.bf16.begin() + begin * per_row, t.bf16.begin() + (begin + count) * per_row);
    }
    return out;
  }
  ASSIGN_OR_RETURN(const RowFormat f, FormatOf(t, name));
  out.blocks.assign(t.blocks.begin() + begin * f.row_bytes,
                    t.blocks.begin() + (begin + count) * f.row_bytes);
  return out;
}

// Columns [begin, begin + count) of every row of a matrix.
absl::StatusOr<HostTensor> SliceCols(const HostTensor& t, int64_t begin, int64_t count,
                                     const std::string& name) {
  HostTensor out;
  out.dtype = t.dtype;
  out.quant = t.quant;
  out.shape = {t.shape[0], count};
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (t.quant == WeightQuant::kNone) {
    for (int64_t r = 0; r < rows; ++r) {
      if (t.dtype == WeightDType::kF32) {
        out.f32.insert(out.f32.end(), t.f32.begin() + r * cols + begin,
                       t.f32.begin() + r * cols + begin + count);
      } else {
        out.bf16.insert(out.bf16.end(), t.bf16.begin() + r * cols + begin,
                        t.bf16.begin() + r * cols + begin + count);
      }
    }
    return out;
  }
  ASSIGN_OR_RETURN(const RowFormat f, FormatOf(t, name));
  if (begin % f.block_elements != 0 || count % f.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": splitting its ", cols, " columns ", count, " a rank would cut its blocks of ",
        f.block_elements, " (", WeightQuantName(t.quant), ")"));
  }
  const int64_t first = begin / f.block_elements * f.block_bytes;
  const int64_t bytes = count / f.block_elements * f.block_bytes;
  for (int64_t r = 0; r < rows; ++r) {
    const auto row = t.blocks.begin() + r * f.row_bytes;
    out.blocks.insert(out.blocks.end(), row + first, row + first + bytes);
  }
  return out;
}

}  // namespace

absl::StatusOr<HostWeights> ShardWeights(const HostWeights& weights, int rank, int size) {
  const ModelConfig& c = weights.config;
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel rank ", rank, " of ", size));
  }
  if (c.moe.num_experts > 0) {
    return absl::InvalidArgumentError(
        "tensor parallelism of mixture-of-experts models is not built");
  }
  if (c.num_heads % size != 0 || c.num_kv_heads % size != 0 || c.intermediate_size % size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism over ", size, " ranks needs heads (", c.num_heads,
                     "), KV heads (", c.num_kv_heads, ") and the intermediate size (",
                     c.intermediate_size, ") divisible by ", size));
  }
  HostWeights out;
  out.config = c;
  out.config.num_heads = c.num_heads / size;
  out.config.num_kv_heads = c.num_kv_heads / size;
  out.config.intermediate_size = c.intermediate_size / size;
  out.kv_dtype = weights.kv_dtype;
  out.weight_dtype = weights.weight_dtype;
  out.load_seconds = weights.load_seconds;
  out.source_bytes = weights.source_bytes;
  out.fingerprint = ExtendModelFingerprintForCompute(
      weights.fingerprint, absl::StrCat("tensor_parallel=", rank, "/", size));
  const int64_t hd = c.head_dim;
  const int64_t q = out.config.num_heads * hd, kv = out.config.num_kv_heads * hd;
  const int64_t f = out.config.intermediate_size;
  for (const auto& entry : weights.tensors) {
    const std::string& name = entry.first;
    const HostTensor& t = entry.second;
    auto ends = [&name](const char* suffix) {
      const std::string s(suffix);
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    absl::StatusOr<HostTensor> shard;
    if (ends("self_attn.q_proj.weight") || ends("self_attn.q_proj.bias")) {
      shard = SliceRows(t, rank * q, q, name);
    } else if (ends("self_attn.k_proj.weight") || ends("self_attn.k_proj.bias") ||
               ends("self_attn.v_proj.weight") || ends("self_attn.v_proj.bias")) {
      shard = SliceRows(t, rank * kv, kv, name);
    } else if (ends("self_attn.o_proj.weight")) {
      shard = SliceCols(t, rank * q, q, name);
    } else if (ends("mlp.gate_proj.weight") || ends("mlp.up_proj.weight")) {
      shard = SliceRows(t, rank * f, f, name);
    } else if (ends("mlp.down_proj.weight")) {
      shard = SliceCols(t, rank * f, f, name);
    } else {
      shard = t;  // embedding, norms, LM head: every rank has them whole
    }
    if (!shard.ok()) return shard.status();
    out.tensors.emplace(name, *std::move(shard));
  }
  return out;
}

}  // namespace ferry
