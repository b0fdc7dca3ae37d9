// GGUF files (llama.cpp's model format): header, metadata key-values and tensor descriptions.
//
// The file is memory-mapped read-only; strings and tensor data are addressed in place, so
// opening a multi-GiB model costs a parse of its header and metadata only. Every read is bounds-
// checked: a truncated or corrupt file is an error naming what is wrong and where, never a crash.
//
// Used by the tokenizer (metadata: vocabulary, merges, special tokens) and the model loader
// (hyper-parameters and tensors). Format reference: the GGUF specification (versions 2 and 3;
// version 1 files, with 32-bit counts, are refused).

#ifndef FERRY_ENGINE_GGUF_GGUF_FILE_H_
#define FERRY_ENGINE_GGUF_GGUF_FILE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ferry {

enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

absl::string_view GgufTypeName(GgufType type);

// The block layout of a ggml tensor type: elements per block and bytes per block. False for
// types whose layout Ferry does not know.
bool GgmlBlockLayout(uint32_t ggml_type, uint64_t* block_elements, uint64_t* block_bytes);

// One metadata value. Scalars are widened (integers to int64/uint64, floats to double); strings
// point into the mapped file; arrays hold their elements.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t u = 0;  // unsigned integers and bool
  int64_t i = 0;   // signed integers (also set for unsigned values that fit)
  double f = 0;    // floats
  absl::string_view s;
  GgufType element_type = GgufType::kUint8;  // arrays only
  std::vector<GgufValue> elements;           // arrays only

  bool is_integer() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // GGUF order: dims[0] is the fastest-varying
  uint32_t ggml_type = 0;      // ggml_type enum value (0 = F32, 1 = F16, 30 = BF16, ...)
  uint64_t offset = 0;         // from the start of the data section
  uint64_t size_bytes = 0;     // 0 when the type's block layout is unknown to Ferry
  const uint8_t* data = nullptr;
};

// Thread-compatible after Open(); the mapping lives as long as the object.
class GgufFile {
 public:
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a GGUF image held in memory (not copied; must outlive the object). For tests/fuzzing.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBuffer(absl::string_view bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  bool Has(absl::string_view key) const;
  // Typed accessors: NotFound if absent, InvalidArgument on a type mismatch, naming the key.
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  // Any integer type whose value fits.
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<std::vector<absl::string_view>> GetStringArray(absl::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(absl::string_view key) const;

 private:
  GgufFile() = default;
  absl::Status Parse();
  absl::StatusOr<const GgufValue*> Find(absl::string_view key) const;

  std::string path_ = "<memory>";
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_GGUF_GGUF_FILE_H_
