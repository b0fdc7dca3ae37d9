// Communicator: the collective operations tensor parallelism needs between the ranks of one
// model (ARCHITECTURE.md §4), over device memory of each rank's backend. Implementations: the
// in-process one for CPU backends (local_communicator.h: the ranks are threads of one process)
// and NCCL's for GPUs (engine/backends/cuda/nccl_communicator.h).
//
// Every rank calls each operation in the same order with matrices of the same shape and type.
// Reductions are in a fixed order, so every rank gets the same bits and a run repeats bit for bit;
// which order, and how a call completes, is the implementation's: the in-process one reduces in
// rank order and returns with the result in place (a rank that never comes is DeadlineExceeded),
// NCCL's in its own order, ordered on the GPU's stream.
//
// Thread-compatible per rank: one thread drives one rank's Communicator.

#ifndef FERRY_ENGINE_PARALLEL_COMMUNICATOR_H_
#define FERRY_ENGINE_PARALLEL_COMMUNICATOR_H_

#include "absl/status/status.h"
#include "engine/backends/backend.h"

namespace ferry {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: x becomes the elementwise sum of every rank's x.
  virtual absl::Status AllReduceSum(const DeviceMatrix& x) = 0;
  // out (x.rows x x.cols * size) = the ranks' x side by side: rank r's in columns
  // [r * x.cols, (r + 1) * x.cols).
  virtual absl::Status AllGather(const DeviceMatrix& x, const DeviceMatrix& out) = 0;
};

}  // namespace ferry

#endif  // FERRY_ENGINE_PARALLEL_COMMUNICATOR_H_
