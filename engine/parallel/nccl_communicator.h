// The Communicator (engine/parallel/communicator.h) between GPUs, through NCCL: one rank per GPU,
// each over its CudaBackend's stream (collectives are ordered with the rank's kernels and return
// once enqueued; the next kernel that reads the result runs after them).
//
// Reduction order: NCCL's (its ring or tree for the group's size and topology), not rank order:
// fixed for a given group on a given machine, so a GPU tensor-parallel run repeats bit for bit
// there, but it is not the CPU's order. AllGather writes the ranks' matrices side by side as the
// interface says (NCCL gathers rank-major; the result is rearranged on the device).
//
// Matrices must be dense (stride == cols). Errors are NCCL's, as Internal. Thread-compatible per
// rank; ranks in one process need one thread each (NCCL's group calls are not used).

#ifndef FERRY_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_
#define FERRY_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/cuda/cuda_backend.h"
#include "engine/parallel/communicator.h"

namespace ferry {

class NcclCommunicator : public Communicator {
 public:
  // One communicator per backend (one GPU each, all in this process), rank i for backends[i].
  static absl::StatusOr<std::vector<std::unique_ptr<NcclCommunicator>>> CreateGroup(
      const std::vector<CudaBackend*>& backends);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllReduceSum(const DeviceMatrix& x) override;
  absl::Status AllGather(const DeviceMatrix& x, const DeviceMatrix& out) override;

 private:
  NcclCommunicator(void* comm, CudaBackend* backend, int rank, int size)
      : comm_(comm), backend_(backend), rank_(rank), size_(size) {}

  void* comm_;  // ncclComm_t
  CudaBackend* backend_;
  const int rank_, size_;
  DeviceBuffer gathered_;  // AllGather's rank-major staging
};

}  // namespace ferry

#endif  // FERRY_ENGINE_PARALLEL_NCCL_COMMUNICATOR_H_
