// LoadGgufModel: a GGUF file of llama.cpp's `llama` architecture (dense, or Mixtral-style with
// experts) or `qwen2moe` -> HostWeights under the HF names of hf_loader.cc. Expert tensors (one
// 3-D tensor per projection, experts outermost) become one matrix per expert, each a slice of the
// file's bytes, so --weights native keeps every expert in the file's block format.

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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

absl::StatusOr<bool> BoolOr(const GgufFile& g, const std::string& key, bool fallback) {
  if (!g.Has(key)) return fallback;
  ASSIGN_OR_RETURN(const int64_t v, g.GetInt(key));
  return v != 0;
}

}  // namespace

absl::StatusOr<ModelConfig> ReadGgufModelConfig(const GgufFile& g) {
  ModelConfig c;
  ASSIGN_OR_RETURN(const std::string arch, g.GetString("general.architecture"));
  if (arch != "llama" && arch != "qwen2moe") {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF architecture '", arch, "' is not supported (supported: llama, qwen2moe)"));
  }
  const std::string a = arch + ".";
  ASSIGN_OR_RETURN(c.hidden_size, g.GetInt(a + "embedding_length"));
  ASSIGN_OR_RETURN(const int64_t experts, IntOr(g, a + "expert_count", 0));
  if (arch == "qwen2moe" && experts <= 0) {
    return absl::InvalidArgumentError("GGUF qwen2moe.expert_count is missing or not positive");
  }
  // Qwen2-MoE's every layer is sparse: its dense width is unused (and may be absent).
  ASSIGN_OR_RETURN(c.intermediate_size, experts > 0 ? IntOr(g, a + "feed_forward_length", 0)
                                                    : g.GetInt(a + "feed_forward_length"));
  if (experts > 0) {
    MoeConfig& m = c.moe;
    m.num_experts = experts;
    ASSIGN_OR_RETURN(m.experts_per_token, g.GetInt(a + "expert_used_count"));
    ASSIGN_OR_RETURN(m.expert_intermediate_size,
                     IntOr(g, a + "expert_feed_forward_length", c.intermediate_size));
    ASSIGN_OR_RETURN(m.shared_intermediate_size,
                     IntOr(g, a + "expert_shared_feed_forward_length", 0));
    // Qwen2-MoE's shared expert always has its sigmoid gate (ffn_gate_inp_shexp).
    m.shared_expert_gate = arch == "qwen2moe" && m.shared_intermediate_size > 0;
    // llama.cpp renormalizes the chosen experts' weights for Mixtral, not for Qwen2-MoE.
    ASSIGN_OR_RETURN(m.norm_topk_prob, BoolOr(g, a + "expert_weights_norm", arch == "llama"));
    if (c.intermediate_size == 0) c.intermediate_size = m.expert_intermediate_size;
  }
  c.architecture = arch == "qwen2moe" ? "qwen2_moe" : experts > 0 ? "mixtral" : "llama";
  c.attention_bias = arch == "qwen2moe";
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

// HF name and expected [rows, cols] (cols 0 for vectors) of a GGUF tensor name. With experts > 0
// the GGUF tensor is [experts, rows, cols] and becomes one matrix per expert, named
// `name` with "{e}" replaced by the expert's index.
struct Mapped {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t permute_heads = 0;  // llama.cpp permuted the rows of q/k for this many heads
  int64_t experts = 0;
};

absl::StatusOr<Mapped> MapTensor(const std::string& gguf_name, const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  if (gguf_name == "token_embd.weight") return Mapped{"model.embed_tokens.weight", c.vocab_size, h};
  if (gguf_name == "output_norm.weight") return Mapped{"model.norm.weight", h, 0};
  if (gguf_name == "output.weight") return Mapped{"lm_head.weight", c.vocab_size, h};
  // llama.cpp's llama architecture rotates interleaved pairs, so its converter permuted q and k;
  // Qwen2-MoE's rotates halves, as HF does.
  const bool permuted = c.architecture == "llama" || c.architecture == "mixtral";
  const MoeConfig& m = c.moe;
  std::vector<std::string> parts = absl::StrSplit(gguf_name, '.');
  int layer = -1;
  if (parts.size() == 4 && parts[0] == "blk" && absl::SimpleAtoi(parts[1], &layer) && layer >= 0 &&
      layer < c.num_layers && (parts[3] == "weight" || parts[3] == "bias")) {
    const std::string p = absl::StrCat("model.layers.", layer, ".");
    const std::string& w = parts[2];
    if (parts[3] == "bias") {
      if (c.attention_bias && w == "attn_q") return Mapped{p + "self_attn.q_proj.bias", q, 0};
      if (c.attention_bias && w == "attn_k") return Mapped{p + "self_attn.k_proj.bias", kv, 0};
      if (c.attention_bias && w == "attn_v") return Mapped{p + "self_attn.v_proj.bias", kv, 0};
      return absl::InvalidArgumentError(absl::StrCat("unexpected tensor '", gguf_name, "'"));
    }
    if (w == "attn_norm") return Mapped{p + "input_layernorm.weight", h, 0};
    if (w == "ffn_norm") return Mapped{p + "post_attention_layernorm.weight", h, 0};
    if (w == "attn_q")
      return Mapped{p + "self_attn.q_proj.weight", q, h, permuted ? c.num_heads : 0};
    if (w == "attn_k") {
      return Mapped{p + "self_attn.k_proj.weight", kv, h, permuted ? c.num_kv_heads : 0};
    }
    if (w == "attn_v") return Mapped{p + "self_attn.v_proj.weight", kv, h};
    if (w == "attn_output") return Mapped{p + "self_attn.o_proj.weight", h, q};
    if (!c.moe.sparse(layer)) {
      if (w == "ffn_gate") return Mapped{p + "mlp.gate_proj.weight", c.intermediate_size, h};
      if (w == "ffn_up") return Mapped{p + "mlp.up_proj.weight", c.intermediate_size, h};
      if (w == "ffn_down") return Mapped{p + "mlp.down_proj.weight", h, c.intermediate_size};
    } else {
      const int64_t f = m.expert_intermediate_size, sh = m.shared_intermediate_size;
      const std::string e = p + "mlp.experts.{e}.";
      if (w == "ffn_gate_inp") return Mapped{p + "mlp.gate.weight", m.num_experts, h};
      if (w == "ffn_gate_exps") return Mapped{e + "gate_proj.weight", f, h, 0, m.num_experts};
      if (w == "ffn_up_exps") return Mapped{e + "up_proj.weight", f, h, 0, m.num_experts};
      if (w == "ffn_down_exps") return Mapped{e + "down_proj.weight", h, f, 0, m.num_experts};
      if (sh > 0) {
        if (w == "ffn_gate_shexp") return Mapped{p + "mlp.shared_expert.gate_proj.weight", sh, h};
        if (w == "ffn_up_shexp") return Mapped{p + "mlp.shared_expert.up_proj.weight", sh, h};
        if (w == "ffn_down_shexp") return Mapped{p + "mlp.shared_expert.down_proj.weight", h, sh};
      }
      if (m.shared_expert_gate && w == "ffn_gate_inp_shexp") {
        return Mapped{p + "mlp.shared_expert_gate.weight", 1, h};  // [h] in the file
      }
    }
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
    const int64_t got_experts = t.dims.size() > 2 ? static_cast<int64_t>(t.dims[2]) : 0;
    if (t.dims.size() > (mapped->experts > 0 ? 3u : 2u) || got_cols != want_cols ||
        got_rows != want_rows || got_experts != mapped->experts) {
      std::string want = absl::StrCat("[", want_rows, ", ", want_cols, "]");
      if (mapped->experts > 0) want = absl::StrCat("[", mapped->experts, ", ", want.substr(1));
      std::string got = absl::StrCat(got_rows, ", ", got_cols, "]");
      for (size_t d = 2; d < t.dims.size(); ++d) got = absl::StrCat(t.dims[d], ", ", got);
      return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": tensor '", t.name,
                                                     "' has shape [", got, ", expected ", want,
                                                     " for this config"));
    }
    weights.source_bytes += t.size_bytes;
    // One matrix, or one per expert: each expert's rows are a contiguous slice of the tensor.
    const int64_t parts = std::max<int64_t>(1, mapped->experts);
    if (t.size_bytes % parts != 0) {
      return absl::InvalidArgumentError(absl::StrCat(gguf.path(), ": tensor '", t.name, "' of ",
                                                     t.size_bytes, " bytes for ", parts,
                                                     " experts"));
    }
    for (int64_t e = 0; e < parts; ++e) {
      HostTensor tensor;
      tensor.shape = mapped->cols == 0 ? std::vector<int64_t>{mapped->rows}
                                       : std::vector<int64_t>{mapped->rows, mapped->cols};
      tensor.dtype = dtype;
      if (dtype == WeightDType::kNative) {
        // Matrices in a format the engine computes on stay as stored, F32 ones too (routers:
        // llama.cpp keeps them F32); other matrices become bf16, vectors f32 (what llama.cpp
        // computes norms in).
        const bool matrix = mapped->cols != 0;
        tensor.quant = matrix ? WeightQuantOfGgmlType(t.ggml_type) : WeightQuant::kNone;
        tensor.dtype = !matrix || t.ggml_type == static_cast<uint32_t>(GgmlType::kF32)
                           ? WeightDType::kF32
                           : WeightDType::kBF16;
      }
      std::string name = mapped->name;
      if (mapped->experts > 0) {
        name = absl::StrReplaceAll(name, {{"{e}", absl::StrCat(e)}});
      }
      auto [it, inserted] = weights.tensors.emplace(name, std::move(tensor));
      if (!inserted) {
        return absl::InvalidArgumentError(
            absl::StrCat(gguf.path(), ": tensor '", t.name, "' twice"));
      }
      const size_t bytes = t.size_bytes / parts;
      std::string source = absl::StrCat(gguf.path(), ": tensor '", t.name, "'");
      if (mapped->experts > 0) absl::StrAppend(&source, " expert ", e);
      jobs.push_back({std::move(source), t.ggml_type, t.data + e * bytes, bytes, &it->second,
                      mapped->permute_heads});
    }
  }
  weights.config.tie_word_embeddings = weights.tensors.count("lm_head.weight") == 0;
  // Every expected tensor must be there (MapTensor checked each one's shape).
  for (const auto& [name, shape] : model_internal::ExpectedTensors(weights.config)) {
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
