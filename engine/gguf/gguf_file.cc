#include "engine/gguf/gguf_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxArrayDepth = 4;
constexpr uint32_t kMaxDims = 8;

// Bounds-checked little-endian reader over the file image.
class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size) : base_(base), size_(size) {}

  size_t offset() const { return offset_; }
  size_t remaining() const { return size_ - offset_; }

  absl::Status Read(void* out, size_t n, absl::string_view what) {
    if (n > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF truncated: ", what, " needs ", n,
                                                     " bytes at offset ", offset_, ", ",
                                                     remaining(), " left"));
    }
    std::memcpy(out, base_ + offset_, n);  // GGUF is little-endian, as are Ferry's hosts
    offset_ += n;
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Get(absl::string_view what) {
    T value;
    RETURN_IF_ERROR(Read(&value, sizeof(T), what));
    return value;
  }

  absl::StatusOr<absl::string_view> String(absl::string_view what) {
    ASSIGN_OR_RETURN(const uint64_t length, Get<uint64_t>(what));
    if (length > remaining()) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF truncated or corrupt: ", what,
                                                     " claims ", length, " bytes at offset ",
                                                     offset_, ", ", remaining(), " left"));
    }
    absl::string_view s(reinterpret_cast<const char*>(base_ + offset_), length);
    offset_ += length;
    return s;
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t offset_ = 0;
};

size_t ScalarSize(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
    case GgufType::kString:  // at least its length
      return 8;
    case GgufType::kArray:
      return 12;  // at least element type + count
  }
  return 1;
}

absl::Status ReadValue(Cursor& in, GgufType type, const std::string& key, int depth,
                       GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufType::kUint8: {
      ASSIGN_OR_RETURN(out->u, in.Get<uint8_t>(key));
      out->i = static_cast<int64_t>(out->u);
      return absl::OkStatus();
    }
    case GgufType::kInt8: {
      ASSIGN_OR_RETURN(out->i, in.Get<int8_t>(key));
      return absl::OkStatus();
    }
    case GgufType::kUint16: {
      ASSIGN_OR_RETURN(out->u, in.Get<uint16_t>(key));
      out->i = static_cast<int64_t>(out->u);
      return absl::OkStatus();
    }
    case GgufType::kInt16: {
      ASSIGN_OR_RETURN(out->i, in.Get<int16_t>(key));
      return absl::OkStatus();
    }
    case GgufType::kUint32: {
      ASSIGN_OR_RETURN(out->u, in.Get<uint32_t>(key));
      out->i = static_cast<int64_t>(out->u);
      return absl::OkStatus();
    }
    case GgufType::kInt32: {
      ASSIGN_OR_RETURN(out->i, in.Get<int32_t>(key));
      return absl::OkStatus();
    }
    case GgufType::kUint64: {
      ASSIGN_OR_RETURN(out->u, in.Get<uint64_t>(key));
      out->i = static_cast<int64_t>(out->u);  // is_integer() checks the range
      return absl::OkStatus();
    }
    case GgufType::kInt64: {
      ASSIGN_OR_RETURN(out->i, in.Get<int64_t>(key));
      return absl::OkStatus();
    }
    case GgufType::kFloat32: {
      ASSIGN_OR_RETURN(const float f, in.Get<float>(key));
      out->f = f;
      return absl::OkStatus();
    }
    case GgufType::kFloat64: {
      ASSIGN_OR_RETURN(out->f, in.Get<double>(key));
      return absl::OkStatus();
    }
    case GgufType::kBool: {
      ASSIGN_OR_RETURN(const uint8_t b, in.Get<uint8_t>(key));
      if (b > 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF corrupt: bool value ", int{b}, " for '", key, "'"));
      }
      out->u = b;
      return absl::OkStatus();
    }
    case GgufType::kString: {
      ASSIGN_OR_RETURN(out->s, in.String(key));
      return absl::OkStatus();
    }
    case GgufType::kArray: {
      if (depth >= static_cast<int>(kMaxArrayDepth)) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF corrupt: arrays nested too deeply in '", key, "'"));
      }
      ASSIGN_OR_RETURN(const uint32_t element, in.Get<uint32_t>(key));
      if (element > static_cast<uint32_t>(GgufType::kFloat64)) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF corrupt: unknown array element type ", element, " in '", key, "'"));
      }
      ASSIGN_OR_RETURN(const uint64_t count, in.Get<uint64_t>(key));
      out->element_type = static_cast<GgufType>(element);
      // Each element takes at least ScalarSize bytes: refuse counts the file cannot hold before
      // allocating anything.
      if (count > in.remaining() / ScalarSize(out->element_type)) {
        return absl::InvalidArgumentError(absl::StrCat("GGUF corrupt: array '", key, "' claims ",
                                                       count,
                                                       " elements, more than the file holds"));
      }
      out->elements.resize(count);
      for (uint64_t n = 0; n < count; ++n) {
        RETURN_IF_ERROR(ReadValue(in, out->element_type, key, depth + 1, &out->elements[n]));
      }
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("GGUF corrupt: unknown value type ",
                                                 static_cast<uint32_t>(type), " for '", key, "'"));
}

}  // namespace

bool GgmlBlockLayout(uint32_t type, uint64_t* block, uint64_t* bytes) {
  switch (type) {
    case 0:
      *block = 1, *bytes = 4;
      return true;  // F32
    case 1:
      *block = 1, *bytes = 2;
      return true;  // F16
    case 2:
      *block = 32, *bytes = 18;
      return true;  // Q4_0
    case 3:
      *block = 32, *bytes = 20;
      return true;  // Q4_1
    case 6:
      *block = 32, *bytes = 22;
      return true;  // Q5_0
    case 7:
      *block = 32, *bytes = 24;
      return true;  // Q5_1
    case 8:
      *block = 32, *bytes = 34;
      return true;  // Q8_0
    case 9:
      *block = 32, *bytes = 36;
      return true;  // Q8_1
    case 10:
      *block = 256, *bytes = 84;
      return true;  // Q2_K
    case 11:
      *block = 256, *bytes = 110;
      return true;  // Q3_K
    case 12:
      *block = 256, *bytes = 144;
      return true;  // Q4_K
    case 13:
      *block = 256, *bytes = 176;
      return true;  // Q5_K
    case 14:
      *block = 256, *bytes = 210;
      return true;  // Q6_K
    case 15:
      *block = 256, *bytes = 292;
      return true;  // Q8_K
    case 24:
      *block = 1, *bytes = 1;
      return true;  // I8
    case 25:
      *block = 1, *bytes = 2;
      return true;  // I16
    case 26:
      *block = 1, *bytes = 4;
      return true;  // I32
    case 27:
      *block = 1, *bytes = 8;
      return true;  // I64
    case 28:
      *block = 1, *bytes = 8;
      return true;  // F64
    case 30:
      *block = 1, *bytes = 2;
      return true;  // BF16
    default:
      return false;
  }
}

absl::string_view GgufTypeName(GgufType type) {
  static constexpr const char* kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                           "int32",  "float32", "bool",   "string", "array",
                                           "uint64", "int64",   "float64"};
  const auto index = static_cast<uint32_t>(type);
  return index < 13 ? kNames[index] : "unknown";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kUint16:
    case GgufType::kInt16:
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kInt64:
      return true;
    case GgufType::kUint64:
      return u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    default:
      return false;
  }
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open GGUF file ", path));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", path));
  }
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* map = mmap(nullptr, file->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("cannot mmap ", path));
    }
    file->base_ = static_cast<const uint8_t*>(map);
    file->mapped_ = true;
  }
  close(fd);
  const absl::Status status = file->Parse();
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
  }
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBuffer(absl::string_view bytes) {
  auto file = std::unique_ptr<GgufFile>(new GgufFile());
  file->base_ = reinterpret_cast<const uint8_t*>(bytes.data());
  file->size_ = bytes.size();
  RETURN_IF_ERROR(file->Parse());
  return file;
}

GgufFile::~GgufFile() {
  if (mapped_) munmap(const_cast<uint8_t*>(base_), size_);
}

absl::Status GgufFile::Parse() {
  Cursor in(base_, size_);
  ASSIGN_OR_RETURN(const uint32_t magic, in.Get<uint32_t>("magic"));
  if (magic != kMagic) return absl::InvalidArgumentError("not a GGUF file (bad magic)");
  ASSIGN_OR_RETURN(version_, in.Get<uint32_t>("version"));
  if (version_ < 2 || version_ > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported GGUF version ", version_, " (supported: 2 and 3)"));
  }
  ASSIGN_OR_RETURN(const uint64_t tensor_count, in.Get<uint64_t>("tensor count"));
  ASSIGN_OR_RETURN(const uint64_t kv_count, in.Get<uint64_t>("metadata count"));
  // A key-value takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8+4+4+8.
  if (kv_count > in.remaining() / 13 || tensor_count > in.remaining() / 24) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF corrupt: ", kv_count, " metadata and ",
                                                   tensor_count,
                                                   " tensors claimed, more than the file holds"));
  }
  for (uint64_t k = 0; k < kv_count; ++k) {
    ASSIGN_OR_RETURN(const absl::string_view key, in.String("metadata key"));
    ASSIGN_OR_RETURN(const uint32_t type, in.Get<uint32_t>("metadata type"));
    if (type > static_cast<uint32_t>(GgufType::kFloat64)) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF corrupt: unknown value type ", type, " for '", key, "'"));
    }
    GgufValue value;
    RETURN_IF_ERROR(ReadValue(in, static_cast<GgufType>(type), std::string(key), 0, &value));
    if (!metadata_.emplace(std::string(key), std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF corrupt: duplicate key '", key, "'"));
    }
  }
  tensors_.reserve(tensor_count);
  for (uint64_t t = 0; t < tensor_count; ++t) {
    GgufTensorInfo info;
    ASSIGN_OR_RETURN(const absl::string_view name, in.String("tensor name"));
    info.name = std::string(name);
    ASSIGN_OR_RETURN(const uint32_t n_dims, in.Get<uint32_t>("tensor dims"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF corrupt: tensor '", info.name, "' has ", n_dims, " dimensions"));
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      ASSIGN_OR_RETURN(const uint64_t dim, in.Get<uint64_t>("tensor dim"));
      if (dim == 0 || elements > std::numeric_limits<uint64_t>::max() / dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF corrupt: tensor '", info.name, "' has a bad dimension ", dim));
      }
      elements *= dim;
      info.dims.push_back(dim);
    }
    ASSIGN_OR_RETURN(info.ggml_type, in.Get<uint32_t>("tensor type"));
    ASSIGN_OR_RETURN(info.offset, in.Get<uint64_t>("tensor offset"));
    uint64_t block = 0, bytes = 0;
    if (GgmlBlockLayout(info.ggml_type, &block, &bytes)) {
      if (info.dims[0] % block != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF corrupt: tensor '", info.name, "' row of ", info.dims[0],
                         " elements is not a multiple of its type's block of ", block));
      }
      info.size_bytes = elements / block * bytes;
    }
    tensors_.push_back(std::move(info));
  }
  uint64_t alignment = 32;
  if (auto it = metadata_.find("general.alignment"); it != metadata_.end()) {
    if (!it->second.is_integer() || it->second.i <= 0 || (it->second.i & (it->second.i - 1)) != 0) {
      return absl::InvalidArgumentError("GGUF corrupt: general.alignment is not a power of two");
    }
    alignment = static_cast<uint64_t>(it->second.i);
  }
  const uint64_t data_start = (in.offset() + alignment - 1) / alignment * alignment;
  for (GgufTensorInfo& info : tensors_) {
    if (info.offset % alignment != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF corrupt: tensor '", info.name, "' offset is not aligned"));
    }
    if (data_start > size_ || info.offset > size_ - data_start ||
        info.size_bytes > size_ - data_start - info.offset) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF truncated: tensor '", info.name,
                                                     "' data lies beyond the end of the file"));
    }
    info.data = base_ + data_start + info.offset;
  }
  return absl::OkStatus();
}

bool GgufFile::Has(absl::string_view key) const { return metadata_.count(std::string(key)) > 0; }

absl::StatusOr<const GgufValue*> GgufFile::Find(absl::string_view key) const {
  auto it = metadata_.find(std::string(key));
  if (it == metadata_.end()) {
    return absl::NotFoundError(absl::StrCat("GGUF metadata key '", key, "' is missing"));
  }
  return &it->second;
}

namespace {
absl::Status TypeMismatch(absl::string_view key, absl::string_view expected, const GgufValue& v) {
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF metadata '", key, "' is ", GgufTypeName(v.type), ", expected ", expected));
}
}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Find(key));
  if (v->type != GgufType::kString) return TypeMismatch(key, "string", *v);
  return std::string(v->s);
}

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Find(key));
  if (!v->is_integer()) return TypeMismatch(key, "an integer", *v);
  return v->i;
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Find(key));
  if (v->type != GgufType::kFloat32 && v->type != GgufType::kFloat64) {
    return TypeMismatch(key, "a float", *v);
  }
  return v->f;
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Find(key));
  if (v->type != GgufType::kBool) return TypeMismatch(key, "bool", *v);
  return v->u != 0;
}

absl::StatusOr<std::vector<absl::string_view>> GgufFile::GetStringArray(
    absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Find(key));
  if (v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return TypeMismatch(key, "an array of strings", *v);
  }
  std::vector<absl::string_view> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) out.push_back(e.s);
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Find(key));
  if (v->type != GgufType::kArray) return TypeMismatch(key, "an array of integers", *v);
  std::vector<int64_t> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) {
    if (!e.is_integer()) return TypeMismatch(key, "an array of integers", *v);
    out.push_back(e.i);
  }
  return out;
}

}  // namespace ferry
