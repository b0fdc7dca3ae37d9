// load_check MODEL REFERENCE.json: loads a model (a GGUF file with LoadGgufModel, or an HF
// directory with LoadHfModel) in fp32 and in bf16, and compares its config and an XXH3-64 digest
// of every tensor with HF transformers' own loading (tools/python/model_reference.py). Prints the
// load time and rate.

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"
#include "nlohmann/json.hpp"
#include "xxhash.h"

namespace {

std::string Digest(const ferry::HostTensor& t) {
  return t.dtype == ferry::WeightDType::kF32
             ? absl::StrFormat("%016x", XXH3_64bits(t.f32.data(), t.f32.size() * 4))
             : absl::StrFormat("%016x", XXH3_64bits(t.bf16.data(), t.bf16.size() * 2));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: load_check GGUF_OR_DIR REFERENCE.json\n";
    return 2;
  }
  std::ifstream in(argv[2]);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json ref = nlohmann::json::parse(text.str());
  for (const auto dtype : {ferry::WeightDType::kF32, ferry::WeightDType::kBF16}) {
    const char* dname = dtype == ferry::WeightDType::kF32 ? "f32" : "bf16";
    const std::string path = argv[1];
    absl::StatusOr<ferry::HostWeights> weights;
    if (path.size() > 5 && path.substr(path.size() - 5) == ".gguf") {
      auto gguf = ferry::GgufFile::Open(path);
      if (!gguf.ok()) {
        std::cerr << gguf.status() << "\n";
        return 1;
      }
      weights = ferry::LoadGgufModel(**gguf, dtype);
    } else {
      weights = ferry::LoadHfModel(path, dtype);
    }
    if (!weights.ok()) {
      std::cerr << weights.status() << "\n";
      return 1;
    }
    const ferry::ModelConfig& c = weights->config;
    const auto& rc = ref["config"];
    if (rc["vocab_size"] != c.vocab_size || rc["hidden_size"] != c.hidden_size ||
        rc["intermediate_size"] != c.intermediate_size || rc["num_hidden_layers"] != c.num_layers ||
        rc["num_attention_heads"] != c.num_heads || rc["num_key_value_heads"] != c.num_kv_heads ||
        rc["rope_theta"].get<double>() != c.rope_theta ||
        static_cast<float>(rc["rms_norm_eps"].get<double>()) !=
            static_cast<float>(c.rms_norm_eps) ||
        rc["tie_word_embeddings"] != c.tie_word_embeddings) {
      std::cerr << "config differs from transformers': " << rc.dump() << "\n";
      return 1;
    }
    size_t checked = 0;
    for (auto it = ref["tensors"].begin(); it != ref["tensors"].end(); ++it) {
      std::string name = it.key();
      if (name == "lm_head.weight" && c.tie_word_embeddings) name = "model.embed_tokens.weight";
      auto found = weights->tensors.find(name);
      if (found == weights->tensors.end()) {
        std::cerr << "missing tensor " << it.key() << "\n";
        return 1;
      }
      if (found->second.shape != it.value()["shape"].get<std::vector<int64_t>>() ||
          Digest(found->second) != it.value()[dname].get<std::string>()) {
        std::cerr << it.key() << " (" << dname << ") differs from transformers'\n";
        return 1;
      }
      ++checked;
    }
    if (checked != ref["tensors"].size() || checked == 0) return 1;
    double output_bytes = 0;
    for (const auto& [n, t] : weights->tensors) {
      output_bytes += t.elements() * (dtype == ferry::WeightDType::kF32 ? 4.0 : 2.0);
    }
    std::printf(
        "%s: %zu tensors and the config identical to transformers'; loaded %.1f MB of model files "
        "in %.2f s (%.2f GiB/s of output); fingerprint %s\n",
        dname, checked, weights->source_bytes / 1e6, weights->load_seconds,
        output_bytes / weights->load_seconds / (1 << 30), weights->fingerprint.ToHex().c_str());
  }
  return 0;
}
