#include "engine/parallel/local_communicator.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/float_math.h"

namespace ferry {
namespace parallel_internal {

absl::Status Rendezvous::Barrier() {
  const int64_t generation = generation_;
  if (++arrived_ == n_) {
    arrived_ = 0;
    ++generation_;
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + timeout_;
  auto released = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return generation_ != generation || broken_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&released), deadline) || broken_) {
    broken_ = true;
    return absl::DeadlineExceededError(absl::StrCat("tensor-parallel collective: not every one of ",
                                                    n_, " ranks arrived within ",
                                                    absl::FormatDuration(timeout_)));
  }
  return absl::OkStatus();
}

absl::Status Rendezvous::Arrive(int rank, const DeviceMatrix& x, std::vector<DeviceMatrix>* all) {
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::AbortedError("tensor-parallel group broken by an earlier failure");
  posted_[rank] = x;
  const absl::Status s = Barrier();
  if (!s.ok()) return s;
  *all = posted_;
  return absl::OkStatus();
}

absl::Status Rendezvous::Leave(int rank) {
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::AbortedError("tensor-parallel group broken by an earlier failure");
  return Barrier();
}

}  // namespace parallel_internal

namespace {

float Load(const DeviceMatrix& m, int64_t r, int64_t c) {
  const int64_t i = r * m.stride + c;
  return m.dtype == DType::kF32 ? static_cast<const float*>(m.data)[i]
                                : Bf16ToFloat(static_cast<const uint16_t*>(m.data)[i]);
}

void Store(const DeviceMatrix& m, int64_t r, int64_t c, float v) {
  const int64_t i = r * m.stride + c;
  if (m.dtype == DType::kF32) {
    static_cast<float*>(m.data)[i] = v;
  } else {
    static_cast<uint16_t*>(m.data)[i] = FloatToBf16(v);
  }
}

class LocalCommunicator : public Communicator {
 public:
  LocalCommunicator(int rank, std::shared_ptr<parallel_internal::Rendezvous> group)
      : rank_(rank), group_(std::move(group)) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }

  absl::Status AllReduceSum(const DeviceMatrix& x) override {
    std::vector<DeviceMatrix> all;
    absl::Status s = group_->Arrive(rank_, x, &all);
    if (!s.ok()) return s;
    for (const DeviceMatrix& m : all) {
      if (m.rows != x.rows || m.cols != x.cols || m.dtype != x.dtype) {
        group_->Leave(rank_).IgnoreError();
        return absl::InvalidArgumentError("AllReduceSum: the ranks' matrices differ in shape");
      }
    }
    sum_.assign(static_cast<size_t>(x.rows * x.cols), 0.0f);
    for (int64_t r = 0; r < x.rows; ++r) {
      for (int64_t c = 0; c < x.cols; ++c) {
        float acc = Load(all[0], r, c);
        for (size_t k = 1; k < all.size(); ++k) acc = acc + Load(all[k], r, c);
        sum_[r * x.cols + c] = acc;
      }
    }
    s = group_->Leave(rank_);  // every rank has read every input
    if (!s.ok()) return s;
    for (int64_t r = 0; r < x.rows; ++r) {
      for (int64_t c = 0; c < x.cols; ++c) Store(x, r, c, sum_[r * x.cols + c]);
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const DeviceMatrix& x, const DeviceMatrix& out) override {
    if (out.rows != x.rows || out.cols != x.cols * size() || out.dtype != x.dtype) {
      return absl::InvalidArgumentError("AllGather: out must be rows x (cols * ranks), same type");
    }
    std::vector<DeviceMatrix> all;
    absl::Status s = group_->Arrive(rank_, x, &all);
    if (!s.ok()) return s;
    gathered_.assign(static_cast<size_t>(out.rows * out.cols), 0.0f);
    for (size_t k = 0; k < all.size(); ++k) {
      for (int64_t r = 0; r < x.rows; ++r) {
        for (int64_t c = 0; c < x.cols; ++c) {
          gathered_[r * out.cols + k * x.cols + c] = Load(all[k], r, c);
        }
      }
    }
    s = group_->Leave(rank_);
    if (!s.ok()) return s;
    for (int64_t r = 0; r < out.rows; ++r) {
      for (int64_t c = 0; c < out.cols; ++c) Store(out, r, c, gathered_[r * out.cols + c]);
    }
    return absl::OkStatus();
  }

 private:
  const int rank_;
  std::shared_ptr<parallel_internal::Rendezvous> group_;
  std::vector<float> sum_, gathered_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> LocalCommunicatorGroup::Create(int n,
                                                                          absl::Duration timeout) {
  auto group = std::make_shared<parallel_internal::Rendezvous>(n, timeout);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<LocalCommunicator>(r, group));
  return out;
}

}  // namespace ferry
