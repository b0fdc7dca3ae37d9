// LoadHfModel: an HF model directory (config.json + *.safetensors) -> HostWeights.

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/model_fingerprint.h"
#include "engine/common/status.h"
#include "engine/model/dequantize.h"
#include "engine/model/host_weights.h"
#include "engine/model/safetensors_file.h"
#include "nlohmann/json.hpp"

namespace ferry {
namespace {

using Json = nlohmann::json;

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Appends the ids of `j[key]` (an integer or a list of integers; absent or null: none).
absl::Status ReadTokenIds(const Json& j, const char* key, const std::string& path,
                          std::vector<TokenId>* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  const Json& v = j[key];
  std::vector<Json> items =
      v.is_array() ? std::vector<Json>(v.begin(), v.end()) : std::vector<Json>{v};
  for (const Json& item : items) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0 ||
        item.get<int64_t>() > int64_t{0xFFFFFFFF}) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", key, " must be a token id or a list of them"));
    }
    const auto id = static_cast<TokenId>(item.get<int64_t>());
    if (std::find(out->begin(), out->end(), id) == out->end()) out->push_back(id);
  }
  return absl::OkStatus();
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadText(path));
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
}

absl::StatusOr<ModelConfig> ReadHfConfig(const Json& j, const std::string& path) {
  ModelConfig c;
  auto get_int = [&](const char* key, int64_t* out, bool required) -> absl::Status {
    if (!j.contains(key) || j[key].is_null()) {
      if (required) return absl::InvalidArgumentError(absl::StrCat(path, ": missing ", key));
      return absl::OkStatus();
    }
    if (!j[key].is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, " is not an integer"));
    }
    *out = j[key].get<int64_t>();
    return absl::OkStatus();
  };
  c.architecture = j.value("model_type", "");
  if (c.architecture != "llama" && c.architecture != "mistral" && c.architecture != "qwen2" &&
      c.architecture != "qwen3" && c.architecture != "mixtral" && c.architecture != "qwen2_moe" &&
      c.architecture != "qwen3_moe") {
    return absl::UnimplementedError(absl::StrCat(path, ": model_type '", c.architecture,
                                                 "' is not supported (llama, mistral, qwen2, "
                                                 "qwen3, mixtral, qwen2_moe, qwen3_moe)"));
  }
  RETURN_IF_ERROR(get_int("vocab_size", &c.vocab_size, true));
  RETURN_IF_ERROR(get_int("hidden_size", &c.hidden_size, true));
  RETURN_IF_ERROR(get_int("intermediate_size", &c.intermediate_size, true));
  RETURN_IF_ERROR(get_int("num_hidden_layers", &c.num_layers, true));
  RETURN_IF_ERROR(get_int("num_attention_heads", &c.num_heads, true));
  c.num_kv_heads = c.num_heads;
  RETURN_IF_ERROR(get_int("num_key_value_heads", &c.num_kv_heads, false));
  c.head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  RETURN_IF_ERROR(get_int("head_dim", &c.head_dim, false));
  c.max_position_embeddings = 2048;
  RETURN_IF_ERROR(get_int("max_position_embeddings", &c.max_position_embeddings, false));
  c.rope_theta = j.value("rope_theta", 10000.0);
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  c.qk_norm = c.architecture == "qwen3" || c.architecture == "qwen3_moe";
  c.attention_bias =
      j.value("attention_bias", c.architecture == "qwen2");  // Qwen2 has q/k/v biases
  if (c.architecture == "mixtral") {
    MoeConfig& m = c.moe;
    RETURN_IF_ERROR(get_int("num_local_experts", &m.num_experts, true));
    RETURN_IF_ERROR(get_int("num_experts_per_tok", &m.experts_per_token, true));
    m.expert_intermediate_size = c.intermediate_size;
    m.norm_topk_prob = true;  // Mixtral always renormalises the top-k weights
  } else if (c.architecture == "qwen2_moe" || c.architecture == "qwen3_moe") {
    MoeConfig& m = c.moe;
    // Qwen2-MoE's q/k/v always have biases; Qwen3-MoE's have none unless attention_bias.
    c.attention_bias = j.value("attention_bias", c.architecture == "qwen2_moe");
    RETURN_IF_ERROR(get_int("num_experts", &m.num_experts, true));
    RETURN_IF_ERROR(get_int("num_experts_per_tok", &m.experts_per_token, true));
    RETURN_IF_ERROR(get_int("moe_intermediate_size", &m.expert_intermediate_size, true));
    RETURN_IF_ERROR(get_int("shared_expert_intermediate_size", &m.shared_intermediate_size, false));
    m.shared_expert_gate = m.shared_intermediate_size > 0;
    m.norm_topk_prob = j.value("norm_topk_prob", false);
    int64_t step = 1;
    RETURN_IF_ERROR(get_int("decoder_sparse_step", &step, false));
    if (step < 1)
      return absl::InvalidArgumentError(absl::StrCat(path, ": decoder_sparse_step < 1"));
    m.dense_layers.assign(c.num_layers, false);
    for (int64_t l = 0; l < c.num_layers; ++l) m.dense_layers[l] = (l + 1) % step != 0;
    if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
      for (const Json& l : j["mlp_only_layers"]) {
        if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c.num_layers) {
          return absl::InvalidArgumentError(absl::StrCat(path, ": bad mlp_only_layers entry"));
        }
        m.dense_layers[l.get<int64_t>()] = true;
      }
    }
  }
  // Sliding-window layers, as the families spell them: Mistral and Mixtral's sliding_window
  // covers every layer; Qwen2/Qwen3(-MoE) apply it with use_sliding_window to the layers from
  // max_window_layers on (the model definition's flash-attention path); layer_types
  // ("sliding_attention" / "full_attention"), where present, names each layer's kind.
  int64_t window = 0;
  RETURN_IF_ERROR(get_int("sliding_window", &window, false));
  if (window < 0 || window > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad sliding_window"));
  }
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    const Json& types = j["layer_types"];
    if (static_cast<int64_t>(types.size()) != c.num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": layer_types has ", types.size(),
                                                     " entries for ", c.num_layers, " layers"));
    }
    c.sliding_windows.assign(c.num_layers, 0);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const std::string type = types[l].is_string() ? types[l].get<std::string>() : "";
      if (type == "sliding_attention") {
        if (window == 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(path, ": sliding_attention layers without a sliding_window"));
        }
        c.sliding_windows[l] = static_cast<int32_t>(window);
      } else if (type != "full_attention") {
        return absl::UnimplementedError(
            absl::StrCat(path, ": layer type '", type, "' is not supported"));
      }
    }
  } else if (window > 0 && (c.architecture == "mistral" || c.architecture == "mixtral")) {
    c.sliding_windows.assign(c.num_layers, static_cast<int32_t>(window));
  } else if (window > 0 && j.value("use_sliding_window", false)) {
    int64_t from = c.num_layers;
    RETURN_IF_ERROR(get_int("max_window_layers", &from, false));
    c.sliding_windows.assign(c.num_layers, 0);
    for (int64_t l = std::max<int64_t>(from, 0); l < c.num_layers; ++l) {
      c.sliding_windows[l] = static_cast<int32_t>(window);
    }
  }
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const Json& rs = j["rope_scaling"];
    const std::string type = rs.value("rope_type", rs.value("type", std::string("default")));
    c.rope_scaling.factor = rs.value("factor", 1.0);
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
    } else if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::kLlama3;
      c.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0);
      c.rope_scaling.original_max_position_embeddings =
          rs.value("original_max_position_embeddings", int64_t{8192});
    } else if (type != "default") {
      return absl::UnimplementedError(
          absl::StrCat(path, ": rope scaling '", type, "' is not supported (linear, llama3)"));
    }
  }
  RETURN_IF_ERROR(ReadTokenIds(j, "eos_token_id", path, &c.eos_token_ids));
  RETURN_IF_ERROR(c.Validate());
  return c;
}

// A LLaVA directory's config.json holds the text model's configuration under text_config, as
// save_pretrained writes it: without the fields equal to the text model type's defaults. These
// are transformers 4.47.1's LlamaConfig / MistralConfig / Qwen2Config defaults for the fields
// ReadHfConfig reads (eos_token_id excepted: generation_config.json gives it, as for any model).
absl::StatusOr<Json> LlavaTextConfig(const Json& j, const std::string& path) {
  if (!j.contains("text_config") || !j["text_config"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": a llava config without text_config"));
  }
  Json text = j["text_config"];
  const std::string type = text.value("model_type", std::string("llama"));  // LlavaConfig's default
  Json defaults;
  if (type == "llama") {
    defaults = {{"vocab_size", 32000},        {"hidden_size", 4096},
                {"intermediate_size", 11008}, {"num_hidden_layers", 32},
                {"num_attention_heads", 32},  {"max_position_embeddings", 2048},
                {"rms_norm_eps", 1e-6},       {"tie_word_embeddings", false},
                {"rope_theta", 10000.0},      {"attention_bias", false}};
  } else if (type == "mistral") {
    defaults = {{"vocab_size", 32000},
                {"hidden_size", 4096},
                {"intermediate_size", 14336},
                {"num_hidden_layers", 32},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 8},
                {"max_position_embeddings", 4096 * 32},
                {"rms_norm_eps", 1e-6},
                {"tie_word_embeddings", false},
                {"rope_theta", 10000.0},
                {"sliding_window", 4096}};
  } else if (type == "qwen2") {
    // Qwen2Config keeps sliding_window only with use_sliding_window (None otherwise, and None
    // by default), so a saved config that uses the window always spells it.
    defaults = {{"vocab_size", 151936},
                {"hidden_size", 4096},
                {"intermediate_size", 22016},
                {"num_hidden_layers", 32},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 32},
                {"max_position_embeddings", 32768},
                {"rms_norm_eps", 1e-6},
                {"tie_word_embeddings", false},
                {"rope_theta", 10000.0},
                {"use_sliding_window", false},
                {"max_window_layers", 28}};
  } else {
    return absl::UnimplementedError(absl::StrCat(path, ": a llava text model of type '", type,
                                                 "' is not supported (llama, mistral, qwen2)"));
  }
  text["model_type"] = type;
  for (auto it = defaults.begin(); it != defaults.end(); ++it) {
    if (!text.contains(it.key())) text[it.key()] = it.value();
  }
  if (!text.contains("eos_token_id") && j.contains("eos_token_id")) {
    text["eos_token_id"] = j["eos_token_id"];
  }
  return text;
}

// The text model's configuration from config.json: the file itself, or a LLaVA model's
// text_config (*llava set).
absl::StatusOr<ModelConfig> ReadTextConfig(const Json& j, const std::string& path, bool* llava) {
  *llava = j.is_object() && j.value("model_type", "") == "llava";
  if (!*llava) return ReadHfConfig(j, path);
  ASSIGN_OR_RETURN(const Json text, LlavaTextConfig(j, path));
  return ReadHfConfig(text, absl::StrCat(path, " (text_config)"));
}

// Mixtral's MoE tensors under the names Ferry uses (Qwen2-MoE's): block_sparse_moe.gate ->
// mlp.gate, block_sparse_moe.experts.E.{w1,w3,w2} -> mlp.experts.E.{gate,up,down}_proj.
std::string CanonicalTensorName(const ModelConfig& c, const std::string& name) {
  if (c.architecture != "mixtral") return name;
  const std::string from = ".block_sparse_moe.";
  const size_t at = name.find(from);
  if (at == std::string::npos) return name;
  std::string rest = name.substr(at + from.size());
  for (const auto& [w, proj] : {std::pair<const char*, const char*>{".w1.", ".gate_proj."},
                                {".w3.", ".up_proj."},
                                {".w2.", ".down_proj."}}) {
    const size_t k = rest.find(w);
    if (k != std::string::npos) rest.replace(k, std::strlen(w), proj);
  }
  return name.substr(0, at) + ".mlp." + rest;
}

absl::StatusOr<ModelConfig> ReadHfConfigFiles(const std::string& dir, bool* llava) {
  const std::string config_path = dir + "/config.json";
  ASSIGN_OR_RETURN(const Json config_json, ReadJsonFile(config_path));
  ASSIGN_OR_RETURN(ModelConfig config, ReadTextConfig(config_json, config_path, llava));
  // What transformers' generate() stops on: generation_config.json's eos ids, when present.
  const std::string generation_path = dir + "/generation_config.json";
  if (std::ifstream(generation_path).good()) {
    ASSIGN_OR_RETURN(const Json generation, ReadJsonFile(generation_path));
    RETURN_IF_ERROR(
        ReadTokenIds(generation, "eos_token_id", generation_path, &config.eos_token_ids));
    RETURN_IF_ERROR(config.Validate());
  }
  return config;
}

}  // namespace

absl::StatusOr<ModelConfig> ReadHfModelConfig(const std::string& dir) {
  bool llava = false;
  return ReadHfConfigFiles(dir, &llava);
}

absl::StatusOr<HostWeights> LoadHfModel(const std::string& dir, WeightDType dtype,
                                        const std::string& kv_dtype) {
  const double start = model_internal::SteadySeconds();
  // Safetensors files hold no block formats: their native type is bf16.
  if (dtype == WeightDType::kNative) dtype = WeightDType::kBF16;
  HostWeights weights;
  const std::string config_path = dir + "/config.json";
  bool llava = false;
  ASSIGN_OR_RETURN(weights.config, ReadHfConfigFiles(dir, &llava));

  // The shards: model.safetensors, or those listed by model.safetensors.index.json.
  std::vector<std::string> files;
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (auto index_text = ReadText(index_path); index_text.ok()) {
    std::set<std::string> shards;
    try {
      const Json index = Json::parse(*index_text);
      for (auto it = index.at("weight_map").begin(); it != index.at("weight_map").end(); ++it) {
        shards.insert(it.value().get<std::string>());
      }
    } catch (const Json::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", e.what()));
    }
    for (const std::string& s : shards) {
      if (s.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": shard '", s, "' is not a file name in the directory"));
      }
      files.push_back(dir + "/" + s);
    }
  } else {
    files.push_back(dir + "/model.safetensors");
  }

  const auto expected = model_internal::ExpectedTensors(weights.config);
  ModelFingerprintBuilder fingerprint;
  RETURN_IF_ERROR(fingerprint.AddFileFromDisk("config.json", config_path));
  std::vector<model_internal::ConversionJob> jobs;
  std::vector<std::unique_ptr<SafetensorsFile>> open_files;  // mapped until converted
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> st, SafetensorsFile::Open(file));
    RETURN_IF_ERROR(fingerprint.AddFileFromDisk(file.substr(file.rfind('/') + 1), file));
    for (auto it = st->header().begin(); it != st->header().end(); ++it) {
      if (it.key() == "__metadata__") continue;
      std::string name = it.key();
      if (llava) {
        // The text model's tensors under its own names; the tower's and projector's are the
        // VisionTower's (engine/model/vision).
        if (absl::StartsWith(name, "vision_tower.") ||
            absl::StartsWith(name, "multi_modal_projector.")) {
          continue;
        }
        if (!absl::StartsWith(name, "language_model.")) {
          return absl::InvalidArgumentError(
              absl::StrCat(file, ": unexpected tensor '", name, "' in a llava model"));
        }
        name = name.substr(std::strlen("language_model."));
      }
      name = CanonicalTensorName(weights.config, name);
      auto want = expected.find(name);
      if (want == expected.end()) {
        if (name == "lm_head.weight" && weights.config.tie_word_embeddings) continue;
        return absl::InvalidArgumentError(absl::StrCat(file, ": unexpected tensor '", name, "'"));
      }
      HostTensor tensor;
      try {
        tensor.shape = it.value().at("shape").get<std::vector<int64_t>>();
      } catch (const Json::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", name, "': ", e.what()));
      }
      if (tensor.shape != want->second) {
        return absl::InvalidArgumentError(absl::StrCat(
            file, ": tensor '", name, "' has shape [", absl::StrJoin(tensor.shape, ", "),
            "], config.json implies [", absl::StrJoin(want->second, ", "), "]"));
      }
      auto type = GgmlTypeOfSafetensors(it.value().value("dtype", std::string("?")));
      if (!type.ok()) {
        return absl::Status(type.status().code(),
                            absl::StrCat(file, ": tensor '", name, "': ", type.status().message()));
      }
      ASSIGN_OR_RETURN(const absl::string_view data, st->Data(name, it.value()));
      tensor.dtype = dtype;
      weights.source_bytes += data.size();
      auto [entry, inserted] = weights.tensors.emplace(name, std::move(tensor));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", name, "' twice"));
      }
      jobs.push_back({absl::StrCat(file, ": tensor '", name, "'"), *type,
                      reinterpret_cast<const uint8_t*>(data.data()), data.size(), &entry->second});
    }
    open_files.push_back(std::move(st));
  }
  for (const auto& [name, shape] : expected) {
    if (weights.tensors.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(dir, ": missing tensor ", name));
    }
  }
  RETURN_IF_ERROR(model_internal::ConvertTensors(jobs));
  ASSIGN_OR_RETURN(const std::string tokenizer_text, ReadText(dir + "/tokenizer.json"));
  fingerprint.SetTokenizerDigest(Xxh3Hash128(tokenizer_text));
  RETURN_IF_ERROR(model_internal::FinishLoad(fingerprint, kv_dtype, dtype, start, &weights));
  return weights;
}

}  // namespace ferry
