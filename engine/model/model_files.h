// A model named by a path, as the binaries take it (--model): an HF directory (config.json,
// safetensors, tokenizer.json) or a GGUF file. Opened once: the tokenizer at once, the weights or
// the configuration alone on demand. What the worker and ferry-calibrate load the same way.
//
// Not thread-safe; the GGUF file stays mapped while the ModelFiles lives.

#ifndef FERRY_ENGINE_MODEL_MODEL_FILES_H_
#define FERRY_ENGINE_MODEL_MODEL_FILES_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"
#include "engine/model/model_config.h"
#include "engine/tokenizer/tokenizer.h"

namespace ferry {

class ModelFiles {
 public:
  // Errors name the path and what it must be (a GGUF file or an HF directory).
  static absl::StatusOr<ModelFiles> Open(const std::string& path);

  const std::string& path() const { return path_; }
  bool hf() const { return hf_; }
  // The file or directory's name, the default model name.
  std::string name() const;
  // The tokenizer's file (an HF directory's tokenizer.json, or the GGUF file).
  std::string tokenizer_file() const;
  // Moves the tokenizer out (once).
  std::unique_ptr<Tokenizer> TakeTokenizer() { return std::move(tokenizer_); }
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }

  absl::StatusOr<HostWeights> LoadWeights(WeightDType dtype, const std::string& kv_dtype) const;
  absl::StatusOr<ModelConfig> ReadConfig() const;

 private:
  std::string path_;
  bool hf_ = false;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_MODEL_FILES_H_
