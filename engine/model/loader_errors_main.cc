// The C++ half of loader_errors_test.sh: loads each file of the table and checks the outcome.

#include <cstdio>
#include <string>
#include <vector>

#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string dir = argv[1];
  struct Case {
    const char* file;
    const char* error;                  // nullptr: must load
    std::vector<int32_t> windows = {};  // a loaded model's sliding windows, where given
  };
  const std::vector<Case> cases = {
      {"good", nullptr},
      {"good_q8", nullptr},
      {"arch", "architecture 'gpt2' is not supported"},
      {"missing", "missing tensor model.layers.1.mlp.up_proj.weight"},
      {"unexpected", "unexpected tensor 'blk.0.attn_q.bias'"},
      {"shape", "tensor 'blk.0.attn_k.weight' has shape [17, 32], expected [16, 32]"},
      {"heads", "attention heads are not a multiple of 2 key/value heads"},
      {"good_q5", nullptr},
      {"i8_unsupported", "tensor type I8 (24) is not supported"},
      {"truncated", "GGUF truncated"},
      {"moe_good", nullptr},
      {"moe_experts",
       "tensor 'blk.1.ffn_up_exps.weight' has shape [3, 64, 32], expected [4, 64, 32]"},
      {"moe_used", "experts per token"},
      // HF directories (names starting with hf_).
      {"hf_good", nullptr},
      {"hf_no_config", "hf_no_config/config.json: No such file or directory"},
      {"hf_bad_json", "config.json: [json.exception.parse_error.101]"},
      {"hf_arch",
       "model_type 'gpt2' is not supported (llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, "
       "qwen3_moe)"},
      {"hf_rope", "rope scaling 'yarn' is not supported (linear, llama3)"},
      {"hf_heads", "3 attention heads are not a multiple of 2 key/value heads"},
      {"hf_missing", "missing tensor model.layers.1.mlp.up_proj.weight"},
      {"hf_unexpected",
       "model.safetensors: unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"},
      {"hf_shape",
       "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [17, 32], config.json implies "
       "[16, 32]"},
      {"hf_dtype",
       "model.safetensors: tensor 'model.norm.weight': safetensors dtype I32 is not supported"},
      {"hf_no_weights", "hf_no_weights/model.safetensors: No such file or directory"},
      {"hf_truncated", "data lies beyond the end of the file"},
      {"hf_bad_header", "header of 1000000000 bytes runs past the end of the file"},
      {"hf_missing_shard", "model-00001-of-00002.safetensors: No such file or directory"},
      {"hf_llava_good", nullptr},
      {"hf_llava_no_text", "config.json: a llava config without text_config"},
      {"hf_llava_qwen3",
       "a llava text model of type 'qwen3' is not supported (llama, mistral, qwen2)"},
      {"hf_llava_qwen2_hybrid", nullptr, {0, 8}},
      {"hf_llava_qwen2_no_window", nullptr, {0, 0}},
      {"hf_llava_qwen2_kv_heads", "4 attention heads are not a multiple of 32 key/value heads"},
      {"hf_llava_qwen2_no_bias", "missing tensor model.layers.0.self_attn.k_proj.bias"},
      {"hf_llava_stray", "unexpected tensor 'model.norm.bias' in a llava model"},
      {"hf_llava_flat", "unexpected tensor 'lm_head.weight' in a llava model"},
  };
  int failures = 0;
  for (const Case& c : cases) {
    std::string error;
    const bool hf = std::string(c.file).rfind("hf_", 0) == 0;
    const std::string path = dir + "/" + c.file + (hf ? "" : ".gguf");
    auto gguf =
        hf ? absl::StatusOr<std::unique_ptr<ferry::GgufFile>>() : ferry::GgufFile::Open(path);
    if (hf) {
      auto weights = ferry::LoadHfModel(path, ferry::WeightDType::kF32);
      if (!weights.ok()) {
        error = std::string(weights.status().message());
      } else if (c.error == nullptr && weights->config.sliding_windows != c.windows) {
        error = "unexpected sliding windows";
      }
    } else if (!gguf.ok()) {
      error = std::string(gguf.status().message());
    } else {
      // Converted to f32 and kept native: the same outcome.
      auto weights = ferry::LoadGgufModel(**gguf, ferry::WeightDType::kF32);
      if (!weights.ok()) error = std::string(weights.status().message());
      auto native = ferry::LoadGgufModel(**gguf, ferry::WeightDType::kNative);
      const std::string native_error = native.ok() ? "" : std::string(native.status().message());
      if (native_error != error) error = "native load differs: " + native_error;
    }
    const bool ok = c.error == nullptr ? error.empty() : error.find(c.error) != std::string::npos;
    std::printf("%s %-16s %s\n", ok ? "ok  " : "FAIL", c.file,
                error.empty() ? "(loaded)" : error.c_str());
    failures += ok ? 0 : 1;
  }
  std::printf("%zu passed, %d failed\n", cases.size() - failures, failures);
  return failures == 0 ? 0 : 1;
}
