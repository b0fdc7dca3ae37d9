// One safetensors file, mapped read-only, and its parsed JSON header: what the HF loaders
// (hf_loader.cc, vision/vision_tower.cc) read tensors from.
//
// Ownership: the mapping lives as long as the object; the string_views Data() returns point into
// it. Errors (unreadable, truncated, a header that is not a JSON object, a tensor whose offsets
// run past the end) are InvalidArgument or errno statuses naming the path. Thread-compatible.

#ifndef FERRY_ENGINE_MODEL_SAFETENSORS_FILE_H_
#define FERRY_ENGINE_MODEL_SAFETENSORS_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ferry {

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // name -> {"dtype", "shape", "data_offsets"}, and "__metadata__".
  const nlohmann::json& header() const { return header_; }
  const std::string& path() const { return path_; }

  // The bytes of tensor `name` (whose header entry is `info`), checked against the file size.
  absl::StatusOr<absl::string_view> Data(const std::string& name, const nlohmann::json& info) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint64_t data_start_ = 0;
  nlohmann::json header_;
};

// The GGML type (dequantize.h's GgmlType) of a safetensors dtype: F32, F16 and BF16; others are
// Unimplemented.
absl::StatusOr<uint32_t> GgmlTypeOfSafetensors(const std::string& dtype);

}  // namespace ferry

#endif  // FERRY_ENGINE_MODEL_SAFETENSORS_FILE_H_
