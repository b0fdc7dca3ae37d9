#include "engine/model/model_files.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "engine/common/status.h"

namespace ferry {

absl::StatusOr<ModelFiles> ModelFiles::Open(const std::string& path) {
  ModelFiles m;
  m.path_ = path;
  struct stat st;
  m.hf_ = stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  if (m.hf_) {
    ASSIGN_OR_RETURN(m.tokenizer_, Tokenizer::FromHfDirectory(path));
    return m;
  }
  auto opened = GgufFile::Open(path);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("--model ", path,
                                     " (a GGUF file or an HF directory; './ferry models pull' "
                                     "fetches the default): ",
                                     opened.status().message()));
  }
  m.gguf_ = std::move(*opened);
  ASSIGN_OR_RETURN(m.tokenizer_, Tokenizer::FromGguf(*m.gguf_));
  return m;
}

std::string ModelFiles::name() const {
  std::string p = path_;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string ModelFiles::tokenizer_file() const { return hf_ ? path_ + "/tokenizer.json" : path_; }

absl::StatusOr<HostWeights> ModelFiles::LoadWeights(WeightDType dtype,
                                                    const std::string& kv_dtype) const {
  return hf_ ? LoadHfModel(path_, dtype, kv_dtype) : LoadGgufModel(*gguf_, dtype, kv_dtype);
}

absl::StatusOr<ModelConfig> ModelFiles::ReadConfig() const {
  return hf_ ? ReadHfModelConfig(path_) : ReadGgufModelConfig(*gguf_);
}

}  // namespace ferry
