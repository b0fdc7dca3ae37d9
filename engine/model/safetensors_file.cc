#include "engine/model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status.h"
#include "engine/model/dequantize.h"

namespace ferry {

using Json = nlohmann::json;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->path_ = path;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot open ", path));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, absl::StrCat("cannot stat ", path));
  }
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ < 8) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated safetensors file"));
  }
  void* map = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("cannot mmap ", path));
  f->base_ = static_cast<const uint8_t*>(map);
  uint64_t header_size;
  std::memcpy(&header_size, f->base_, 8);
  if (header_size > f->size_ - 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header of ", header_size, " bytes runs past the end of the file"));
  }
  try {
    f->header_ = Json::parse(f->base_ + 8, f->base_ + 8 + header_size);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": bad header: ", e.what()));
  }
  if (!f->header_.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not an object"));
  }
  f->data_start_ = 8 + header_size;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) munmap(const_cast<uint8_t*>(base_), size_);
}

absl::StatusOr<absl::string_view> SafetensorsFile::Data(const std::string& name,
                                                        const Json& info) const {
  uint64_t begin = 0, end = 0;
  try {
    const Json& offsets = info.at("data_offsets");
    begin = offsets.at(0).get<uint64_t>();
    end = offsets.at(1).get<uint64_t>();
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "': bad data_offsets: ", e.what()));
  }
  if (begin > end || end > size_ - data_start_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "' data lies beyond the end of the file"));
  }
  return absl::string_view(reinterpret_cast<const char*>(base_ + data_start_ + begin), end - begin);
}

absl::StatusOr<uint32_t> GgmlTypeOfSafetensors(const std::string& dtype) {
  if (dtype == "F32") return static_cast<uint32_t>(GgmlType::kF32);
  if (dtype == "F16") return static_cast<uint32_t>(GgmlType::kF16);
  if (dtype == "BF16") return static_cast<uint32_t>(GgmlType::kBF16);
  return absl::UnimplementedError(absl::StrCat("safetensors dtype ", dtype, " is not supported"));
}

}  // namespace ferry
