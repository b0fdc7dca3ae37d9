#include "engine/parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status.h"

namespace ferry {
namespace {

absl::Status NcclError(const char* what, ncclResult_t r) {
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

ncclDataType_t NcclType(DType t) { return t == DType::kF32 ? ncclFloat32 : ncclBfloat16; }

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> NcclCommunicator::CreateGroup(
    const std::vector<CudaBackend*>& backends) {
  const int n = static_cast<int>(backends.size());
  if (n < 1) return absl::InvalidArgumentError("NCCL group of no ranks");
  std::vector<int> devices;
  for (CudaBackend* b : backends) devices.push_back(b->device_index());
  std::vector<ncclComm_t> comms(n);
  const ncclResult_t r = ncclCommInitAll(comms.data(), n, devices.data());
  if (r != ncclSuccess) return NcclError("ncclCommInitAll", r);
  std::vector<std::unique_ptr<NcclCommunicator>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(
        std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comms[i], backends[i], i, n)));
  }
  return out;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
}

absl::Status NcclCommunicator::AllReduceSum(const DeviceMatrix& x) {
  if (!x.dense()) return absl::InvalidArgumentError("NCCL AllReduceSum: a dense matrix only");
  cudaSetDevice(backend_->device_index());  // this thread may not be the backend's creator
  RETURN_IF_ERROR(backend_->status());
  const ncclResult_t r = ncclAllReduce(x.data, x.data, static_cast<size_t>(x.rows * x.cols),
                                       NcclType(x.dtype), ncclSum, static_cast<ncclComm_t>(comm_),
                                       static_cast<cudaStream_t>(backend_->stream()));
  return r == ncclSuccess ? absl::OkStatus() : NcclError("ncclAllReduce", r);
}

absl::Status NcclCommunicator::AllGather(const DeviceMatrix& x, const DeviceMatrix& out) {
  if (!x.dense() || out.rows != x.rows || out.cols != x.cols * size_ || out.dtype != x.dtype) {
    return absl::InvalidArgumentError(
        "NCCL AllGather: dense x, out rows x (cols * ranks) of the same type");
  }
  RETURN_IF_ERROR(backend_->status());
  cudaSetDevice(backend_->device_index());
  const size_t elem = DTypeBytes(x.dtype), count = static_cast<size_t>(x.rows * x.cols);
  if (gathered_.bytes() < count * size_ * elem) {
    gathered_.Reset();
    ASSIGN_OR_RETURN(gathered_, backend_->Allocate(count * size_ * elem));
  }
  auto stream = static_cast<cudaStream_t>(backend_->stream());
  const ncclResult_t r = ncclAllGather(x.data, gathered_.data(), count, NcclType(x.dtype),
                                       static_cast<ncclComm_t>(comm_), stream);
  if (r != ncclSuccess) return NcclError("ncclAllGather", r);
  // Rank-major [rank][rows][cols] to side by side [rows][rank][cols].
  for (int k = 0; k < size_; ++k) {
    const cudaError_t e =
        cudaMemcpy2DAsync(static_cast<char*>(out.data) + k * x.cols * elem, out.stride * elem,
                          static_cast<const char*>(gathered_.data()) + k * count * elem,
                          x.cols * elem, x.cols * elem, x.rows, cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) {
      return absl::InternalError(absl::StrCat("AllGather copy: ", cudaGetErrorString(e)));
    }
  }
  return absl::OkStatus();
}

}  // namespace ferry
