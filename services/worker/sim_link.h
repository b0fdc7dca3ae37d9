// The simulated engine's link (`--engine=sim`; engine/model/sim_timing.h): the time a prefill
// worker's KV hand-offs take on the link the calibration describes, so that a push reaches the
// decode worker no earlier than it would on that hardware. The real transport still moves the
// (tiny) bytes; a push completes when both it and its SimLink transfer are done.
//
// The model is processor sharing: the transfers in flight on one link share its bandwidth
// equally (each of n progresses at bandwidth / n), progress-based, so a transfer that joins or
// leaves changes the others' pace from then on; a transfer is done `latency` after its last byte
// was served (the latency is paid once, and does not hold bandwidth). A lone transfer of B bytes
// thus takes latency + B / bandwidth, and n equal ones started together each take
// latency + B x n / bandwidth: SimTiming::TransferSeconds(tokens, n). Bandwidth 0: the bytes cost
// nothing (latency only). A transfer whose deadline comes first ends unserved.
//
// LinkShares is the accounting over explicit times (thread-compatible; the tests' exact values);
// SimLink runs it on real time, with one thread of its own that completes the transfers, so
// that nobody else blocks: Start() returns at once, Transfer() waits.
//
// SimLink is thread-safe. Callbacks run on its thread, never under its lock; they must not
// block. The destructor ends the transfers still in flight unserved (their callbacks run), then
// joins.

#ifndef FERRY_SERVICES_WORKER_SIM_LINK_H_
#define FERRY_SERVICES_WORKER_SIM_LINK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

class LinkShares {
 public:
  explicit LinkShares(double bandwidth_bytes_per_s) : bandwidth_(bandwidth_bytes_per_s) {}

  // Serves the transfers in flight up to `now` (seconds; earlier times than before count as the
  // last), in the order they finish; appends (id, when its last byte was served) of those done,
  // which leave.
  void Advance(double now, std::vector<std::pair<uint64_t, double>>* served);
  // A transfer of `bytes` joins at `now` (Advance(now) first, into `served`).
  void Add(uint64_t id, double bytes, double now, std::vector<std::pair<uint64_t, double>>* served);
  // Leaves unserved at `now` (Advance(now) first, into `served`); false if `id` is not in flight.
  bool Remove(uint64_t id, double now, std::vector<std::pair<uint64_t, double>>* served);
  // When the next transfer is served if none joins or leaves (infinity: none in flight).
  double NextFinish() const;
  int active() const { return static_cast<int>(remaining_.size()); }

 private:
  const double bandwidth_;
  double now_ = 0;                        // the time remaining_ is at
  std::map<uint64_t, double> remaining_;  // bytes left, by id
};

class SimLink {
 public:
  using Done = std::function<void(bool served)>;

  SimLink(double bandwidth_bytes_per_s, double latency_s);
  ~SimLink();
  SimLink(const SimLink&) = delete;
  SimLink& operator=(const SimLink&) = delete;

  // Starts a transfer of `bytes`; `done(true)` runs on the link's thread once it is served and
  // its latency passed, `done(false)` at `deadline` if that comes first (or at destruction).
  void Start(double bytes, absl::Time deadline, Done done);
  // Start, waiting for the outcome: true when served by `deadline`.
  bool Transfer(double bytes, absl::Time deadline);
  // Transfers started whose outcome is not yet known.
  int in_flight() const;

 private:
  struct Pending {
    absl::Time deadline;
    absl::Time done_at = absl::InfiniteFuture();  // once served: + latency
    bool served = false;
    Done done;
  };
  double SecondsAt(absl::Time t) const { return absl::ToDoubleSeconds(t - origin_); }
  // Marks what `served` names; under mu_.
  void NoteServed(const std::vector<std::pair<uint64_t, double>>& served)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  const double latency_s_;
  const absl::Time origin_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  LinkShares shares_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest exists
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_SIM_LINK_H_
