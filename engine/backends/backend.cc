#include "engine/backends/backend.h"

#include "engine/common/log.h"

namespace ferry {

const char* WeightQuantName(WeightQuant q) {
  switch (q) {
    case WeightQuant::kNone:
      return "none";
    case WeightQuant::kQ8_0:
      return "q8_0";
    case WeightQuant::kQ4_0:
      return "q4_0";
    case WeightQuant::kQ4_1:
      return "q4_1";
    case WeightQuant::kQ5_0:
      return "q5_0";
    case WeightQuant::kQ5_1:
      return "q5_1";
    case WeightQuant::kQ4_K:
      return "q4_k";
    case WeightQuant::kQ5_K:
      return "q5_k";
    case WeightQuant::kQ6_K:
      return "q6_k";
  }
  return "?";
}

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
