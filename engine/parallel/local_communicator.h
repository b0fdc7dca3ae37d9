// The in-process Communicator (communicator.h): the ranks are threads of one process, each with
// its own backend whose memory is host memory (the CPU backend), so a rank reads the others'
// matrices directly. Made as a group: LocalCommunicatorGroup::Create(n) gives n communicators,
// rank 0..n-1, to hand one to each rank's thread.
//
// An operation: every rank publishes its matrix and waits for the others (a barrier); each rank
// then computes the whole result into a scratch of its own (reading every rank's input in rank
// order, so every rank gets the same bits); a second barrier, and each rank writes its result.
// A rank that does not arrive within `timeout` fails the others' calls with DeadlineExceeded,
// and the group is then broken: every later call fails at once.
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

// What the ranks share.
class Rendezvous {
 public:
  Rendezvous(int n, absl::Duration timeout) : n_(n), timeout_(timeout), posted_(n) {}
  int size() const { return n_; }
  // Publishes `x` as rank r's and waits for every rank's; then the posted matrices are readable
  // until the matching Leave. Errors: DeadlineExceeded, or the group broke earlier.
  absl::Status Arrive(int rank, const DeviceMatrix& x, std::vector<DeviceMatrix>* all);
  // Waits for every rank to be done reading.
  absl::Status Leave(int rank);

 private:
  absl::Status Barrier() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int n_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::vector<DeviceMatrix> posted_ ABSL_GUARDED_BY(mu_);
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace parallel_internal
}  // namespace ferry

#endif  // FERRY_ENGINE_PARALLEL_LOCAL_COMMUNICATOR_H_
