// The in-process Communicator (communicator.h): the ranks are threads of one process, each with
// its own backend whose memory is host memory (the CPU backend). Made as a group:
// LocalCommunicatorGroup::Create(n) gives n communicators, rank 0..n-1, to hand one to each
// rank's thread.
//
// An operation: every rank copies its matrix into the group's memory and waits for the others (a
// barrier); each rank then computes the whole result from the group's copies, reading them in
// rank order, so every rank gets the same bits; a second barrier (every rank is done reading),
// and each rank writes its result into its own matrix. No rank ever reads another's memory, so
// a rank that gives up early leaves nothing dangling. A rank that does not arrive within
// `timeout` fails the others' calls with DeadlineExceeded, and the group is then broken: every
// later call fails at once (Aborted).
//
// Thread-safe across ranks; each communicator is driven by one thread.

#ifndef FERRY_ENGINE_PARALLEL_LOCAL_COMMUNICATOR_H_
#define FERRY_ENGINE_PARALLEL_LOCAL_COMMUNICATOR_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/parallel/communicator.h"

namespace ferry {

class LocalCommunicatorGroup {
 public:
  // n >= 1 ranks.
  static std::vector<std::unique_ptr<Communicator>> Create(
      int n, absl::Duration timeout = absl::Seconds(60));
};

namespace parallel_internal {

// One rank's matrix as the group holds it: its shape and its values as fp32 (bf16 widens
// exactly).
struct Posted {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kF32;
  std::vector<float> values;
};

// What the ranks share.
class Rendezvous {
 public:
  Rendezvous(int n, absl::Duration timeout) : n_(n), timeout_(timeout), posted_(n) {}
  int size() const { return n_; }
  // Copies `x` in as rank r's and waits for every rank's. Then `all` points at the group's copies,
  // readable until this rank's Leave. Errors: DeadlineExceeded, or Aborted (the group broke).
  absl::Status Arrive(int rank, const DeviceMatrix& x, const std::vector<Posted>** all);
  // Waits for every rank to be done reading.
  absl::Status Leave(int rank);

 private:
  absl::Status Barrier() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int n_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  // Written by its rank in Arrive, under mu_, before the barrier; read by every rank between
  // the barrier and Leave's (no rank writes then).
  std::vector<Posted> posted_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace parallel_internal
}  // namespace ferry

#endif  // FERRY_ENGINE_PARALLEL_LOCAL_COMMUNICATOR_H_
