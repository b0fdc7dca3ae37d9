#include "engine/parallel/local_communicator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/float_math.h"

namespace ferry {
namespace parallel_internal {
namespace {

float Load(const DeviceMatrix& m, int64_t r, int64_t c) {
  const int64_t i = r * m.stride + c;
  return m.dtype == DType::kF32 ? static_cast<const float*>(m.data)[i]
                                : Bf16ToFloat(static_cast<const uint16_t*>(m.data)[i]);
}

}  // namespace

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

absl::Status Rendezvous::Arrive(int rank, const DeviceMatrix& x, const std::vector<Posted>** all) {
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::AbortedError("tensor-parallel group broken by an earlier failure");
  Posted& p = posted_[rank];
  p.rows = x.rows;
  p.cols = x.cols;
  p.dtype = x.dtype;
  p.values.resize(static_cast<size_t>(x.rows * x.cols));
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t c = 0; c < x.cols; ++c) p.values[r * x.cols + c] = Load(x, r, c);
  }
  const absl::Status s = Barrier();
  if (!s.ok()) return s;
  *all = &posted_;
  return absl::OkStatus();
}

absl::Status Rendezvous::Leave(int rank) {
  absl::MutexLock lock(&mu_);
  if (broken_) return absl::AbortedError("tensor-parallel group broken by an earlier failure");
  return Barrier();
}

}  // namespace parallel_internal

namespace {

using parallel_internal::Posted;

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
    const std::vector<Posted>* all = nullptr;
    absl::Status s = group_->Arrive(rank_, x, &all);
    if (!s.ok()) return s;
    bool same = true;
    for (const Posted& p : *all) same = same && p.rows == x.rows && p.cols == x.cols;
    if (same) {
      result_.assign(static_cast<size_t>(x.rows * x.cols), 0.0f);
      for (size_t i = 0; i < result_.size(); ++i) {
        float acc = (*all)[0].values[i];
        for (size_t k = 1; k < all->size(); ++k) acc = acc + (*all)[k].values[i];
        result_[i] = acc;
      }
    }
    s = group_->Leave(rank_);  // every rank has read every copy
    if (!s.ok()) return s;
    if (!same)
      return absl::InvalidArgumentError("AllReduceSum: the ranks' matrices differ in shape");
    for (int64_t r = 0; r < x.rows; ++r) {
      for (int64_t c = 0; c < x.cols; ++c) Store(x, r, c, result_[r * x.cols + c]);
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const DeviceMatrix& x, const DeviceMatrix& out) override {
    // Checked after the barrier, so that every rank fails together rather than the others
    // waiting out the timeout for a rank that refused alone.
    const std::vector<Posted>* all = nullptr;
    absl::Status s = group_->Arrive(rank_, x, &all);
    if (!s.ok()) return s;
    bool valid = out.rows == x.rows && out.cols == x.cols * size();
    for (const Posted& p : *all) valid = valid && p.rows == x.rows && p.cols == x.cols;
    if (valid) {
      result_.assign(static_cast<size_t>(out.rows * out.cols), 0.0f);
      for (size_t k = 0; k < all->size(); ++k) {
        for (int64_t r = 0; r < x.rows; ++r) {
          for (int64_t c = 0; c < x.cols; ++c) {
            result_[r * out.cols + k * x.cols + c] = (*all)[k].values[r * x.cols + c];
          }
        }
      }
    }
    s = group_->Leave(rank_);
    if (!s.ok()) return s;
    if (!valid) {
      return absl::InvalidArgumentError(
          "AllGather: out must be rows x (cols * ranks), every rank's x of one shape");
    }
    for (int64_t r = 0; r < out.rows; ++r) {
      for (int64_t c = 0; c < out.cols; ++c) Store(out, r, c, result_[r * out.cols + c]);
    }
    return absl::OkStatus();
  }

 private:
  const int rank_;
  std::shared_ptr<parallel_internal::Rendezvous> group_;
  std::vector<float> result_;
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
