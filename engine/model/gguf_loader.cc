// LoadGgufModel: a llama-architecture GGUF file -> HostWeights.

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/dequantize.h"
#include "engine/model/host_weights.h"

namespace ferry {
namespace {

absl::StatusOr<int64_t> IntOr(const GgufFile& g, const std::string& key, int64_t fallback) {
  if (!g.Has(key)) return fallback;
  return g.GetInt(key);
}

absl::StatusOr<double> FloatOr(const GgufFile& g, const std::string& key, double fallback) {
  if (!g.Has(key)) return fallback;
  return g.GetFloat(key);
}

}  // namespace

absl::StatusOr<ModelConfig> ReadGgufModelConfig(const GgufFile& g) {
  ModelConfig c;
  ASSIGN_OR_RETURN(c.architecture, g.GetString("general.architecture"));
  if (c.architecture != "llama") {
    return absl::UnimplementedError(absl::StrCat("GGUF architecture '", c.architecture,
                                                 "' is not supported (supported: llama)"));
  }
  const std::string a = c.architecture + ".";
  ASSIGN_OR_RETURN(c.hidden_size, g.GetInt(a + "embedding_length"));
  ASSIGN_OR_RETURN(c.intermediate_size, g.GetInt(a + "feed_forward_length"));
  ASSIGN_OR_RETURN(c.num_layers, g.GetInt(a + "block_count"));
  ASSIGN_OR_RETURN(c.num_heads, g.GetInt(a + "attention.head_count"));
  ASSIGN_OR_RETURN(c.num_kv_heads, IntOr(g, a + "attention.head_count_kv", c.num_heads));
  if (c.num_heads <= 0)
    return absl::InvalidArgumentError("GGUF attention.head_count is not positive");
  ASSIGN_OR_RETURN(c.head_dim, IntOr(g, a + "attention.key_length", c.hidden_size / c.num_heads));
  ASSIGN_OR_RETURN(c.max_position_embeddings, IntOr(g, a + "context_length", 2048));
  ASSIGN_OR_RETURN(c.rope_theta, FloatOr(g, a + "rope.freq_base", 10000.0));
  ASSIGN_OR_RETURN(c.rms_norm_eps, FloatOr(g, a + "attention.layer_norm_rms_epsilon", 1e-5));
  if (g.Has("tokenizer.ggml.tokens")) {
    ASSIGN_OR_RETURN(const std::vector<absl::string_view> tokens,
                     g.GetStringArray("tokenizer.ggml.tokens"));
    c.vocab_size = static_cast<int64_t>(tokens.size());
  }
  ASSIGN_OR_RETURN(c.vocab_size, IntOr(g, a + "vocab_size", c.vocab_size));
  if (g.Has(a + "rope.scaling.type")) {
    ASSIGN_OR_RETURN(const std::string type, g.GetString(a + "rope.scaling.type"));
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      ASSIGN_OR_RETURN(c.rope_scaling.factor, FloatOr(g, a + "rope.scaling.factor", 1.0));
    } else if (type != "none") {
      return absl::UnimplementedError(
          absl::StrCat("GGUF rope scaling '", type, "' is not supported"));
    }
  }
  // The ids that end a turn: end of sequence, end of turn (Llama 3's eot), end of message (eom).
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    if (!g.Has(key)) continue;
    ASSIGN_OR_RETURN(const int64_t id, g.GetInt(key));
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF ", key, " ", id, " is outside the vocabulary (", c.vocab_size, ")"));
    }
    const auto token = static_cast<TokenId>(id);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), token) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(token);
    }
  }
  RETURN_IF_ERROR(c.Validate());
  return c;
}

namespace {

// HF name and expected [rows, cols] (cols 0 for vectors) of a GGUF tensor name.
struct Mapped {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t permute_heads = 0;  // llama.cpp permuted the rows of q/k for this many heads
};

absl::StatusOr<Mapped> MapTensor(const std::string& gguf_name, const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  if (gguf_name == "token_embd.weight") return Mapped{"model.embed_tokens.weight", c.vocab_size, h};
  if (gguf_name == "output_norm.weight") return Mapped{"model.norm.weight", h, 0};
  if (gguf_name == "output.weight") return Mapped{"lm_head.weight", c.vocab_size, h};
  std::vector<std::string> parts = absl::StrSplit(gguf_name, '.');
  int layer = -1;
  if (parts.size() == 4 && parts[0] == "blk" && absl::SimpleAtoi(parts[1], &layer) && layer >= 0 &&
      layer < c.num_layers && parts[3] == "weight") {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    const std::string& w = parts[2];
    if (w == "attn_norm") return Mapped{p + "input_layernorm.weight", h, 0};
    if (w == "ffn_norm") return Mapped{p + "post_attention_layernorm.weight", h, 0};
    if (w == "attn_q") return Mapped{p + "self_attn.q_proj.weight", q, h, c.num_heads};
    if (w == "attn_k") return Mapped{p + "self_attn.k_proj.weight", kv, h, c.num_kv_heads};
    if (w == "attn_v") return Mapped{p + "self_attn.v_proj.weight", kv, h};
    if (w == "attn_output") return Mapped{p + "self_attn.o_proj.weight", h, q};
    if (w == "ffn_gate") return Mapped{p + "mlp.gate_proj.weight", c.intermediate_size, h};
    if (w == "ffn_up") return Mapped{p + "mlp.up_proj.weight", c.intermediate_size, h};
    if (w == "ffn_down") return Mapped{p + "mlp.down_proj.weight", h, c.intermediate_size};
  }
  return absl::InvalidArgumentError(absl::StrCat("unexpected tensor '", gguf_name, "'"));
}

Hash128 TokenizerDigest(const GgufFile& g) {
  Xxh3Hasher128 hasher;
  for (const auto& [key, value] : g.metadata()) {
    if (!absl::StartsWith(key, "tokenizer.ggml.")) continue;
    hasher.Update(key);
    hasher.Update(absl::string_view("\0", 1));
    for (const GgufValue& e :
         value.elements.empty() ? std::vector<GgufValue>{value} : value.elements) {
      if (e.type == GgufType::kString) {
        hasher.Update(e.s);
      } else {
        hasher.Update(absl::StrCat(e.i, ":", e.u, ":", e.f));
      }
      hasher.Update(absl::string_view("\0", 1));
    }
  }
  return hasher.Finish();
}

}  // namespace

absl::StatusOr<HostWeights> LoadGgufModel(const GgufFile& gguf, WeightDType dtype,
                                          const std::string& kv_dtype) {
  const double start = model_internal::SteadySeconds();
  HostWeights weights;
  ASSIGN_OR_RETURN(weights.config, ReadGgufModelConfig(gguf));
  const ModelConfig& c = weights.config;
  std::vector<model_internal::ConversionJob> jobs;
  for (const GgufTensorInfo& t : gguf.tensors()) {
    if (t.name == "rope_freqs.weight") {
      return absl::UnimplementedError("GGUF rope_freqs (llama3 rope scaling) is not supported yet");
    }
    auto mapped = MapTensor(t.name, c);
    if (!mapped.ok())
      return absl::Status(mapped.status().code(),
                          absl::StrCat(gguf.path(), ": ", mapped.status().message()));
    const int64_t want_cols = mapped->cols == 0 ? mapped->rows : mapped->cols;
    const int64_t want_rows = mapped->cols == 0 ? 1 : mapped->rows;
    const int64_t got_cols = static_cast<int64_t>(t.dims[0]);
    const int64_t got_rows = t.dims.size() > 1 ? static_cast<int64_t>(t.dims[1]) : 1;
    if (t.dims.size() > 2 || got_cols != want_cols || got_rows != want_rows) {
      return absl::InvalidArgumentError(
          absl::StrCat(gguf.path(), ": tensor '", t.name, "' has shape [", got_rows, ", ", got_cols,
                       "], expected [", want_rows, ", ", want_cols, "] for this config"));
    }
    HostTensor tensor;
    tensor.shape = mapped->cols == 0 ? std::vector<int64_t>{mapped->rows}
                                     : std::vector<int64_t>{mapped->rows, mapped->cols};
    tensor.dtype = dtype;
    if (dtype == WeightDType::kNative) {
      // Matrices in a format the engine computes on stay as stored; other matrices become bf16,
      // vectors f32 (what llama.cpp computes norms in).
      tensor.quant = mapped->cols == 0 ? WeightQuant::kNone : WeightQuantOfGgmlType(t.ggml_type);
      tensor.dtype = mapped->cols == 0 ? WeightDType::kF32 : WeightDType::kBF16;
    }
    weights.source_bytes += t.size_bytes;
    auto [it, inserted] = weights.tensors.emplace(mapped->name, std::move(tensor));
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": tensor '", t.name, "' twice"));
    }
    jobs.push_back({absl::StrCat(gguf.path(), ": tensor '", t.name, "'"), t.ggml_type, t.data,
                    t.size_bytes, &it->second, mapped->permute_heads});
  }
  weights.config.tie_word_embeddings = weights.tensors.count("lm_head.weight") == 0;
  // Every expected tensor must be there.
  std::vector<std::string> expected = {"model.embed_tokens.weight", "model.norm.weight"};
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const char* w : {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj",
                          "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      expected.push_back(absl::StrCat("model.layers.", l, ".", w, ".weight"));
    }
  }
  for (const std::string& name : expected) {
    if (weights.tensors.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": missing tensor ", name));
    }
  }
  RETURN_IF_ERROR(model_internal::ConvertTensors(jobs));
  ModelFingerprintBuilder fingerprint;
  const std::string& path = gguf.path();
  RETURN_IF_ERROR(fingerprint.AddFileFromDisk(path.substr(path.rfind('/') + 1), path));
  fingerprint.SetTokenizerDigest(TokenizerDigest(gguf));
  RETURN_IF_ERROR(model_internal::FinishLoad(fingerprint, kv_dtype, dtype, start, &weights));
  return weights;
}

}  // namespace ferry
