#include "engine/backends/backend.h"

#include "engine/common/log.h"

namespace ferry {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::Reset() {
  if (owner_ != nullptr && data_ != nullptr) owner_->Free(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

DeviceMatrix DeviceMatrix::RowRange(int64_t begin, int64_t count) const {
  CHECK(begin >= 0 && count >= 0 && begin + count <= rows);
  DeviceMatrix m = *this;
  m.data = static_cast<char*>(data) + begin * stride * static_cast<int64_t>(DTypeBytes(dtype));
  m.rows = count;
  return m;
}

DeviceMatrix DeviceMatrix::ColRange(int64_t begin, int64_t count) const {
  CHECK(begin >= 0 && count >= 0 && begin + count <= cols);
  DeviceMatrix m = *this;
  m.data = static_cast<char*>(data) + begin * static_cast<int64_t>(DTypeBytes(dtype));
  m.cols = count;
  return m;
}

}  // namespace ferry
