// The target side of transfer notifications, shared by the KV transport implementations: matches
// outcomes delivered by peers (Deliver) with the owner's awaits (Await), whichever comes first,
// and times out awaits at their deadlines.
//
// An outcome delivered before its await is kept for `early_ttl` (at most `max_early` of them,
// the oldest dropped first), so a peer that finishes before the owner starts waiting is not
// lost. Every callback runs on the board's own thread, never inside Await or Deliver.
//
// Thread-safe.

#ifndef FERRY_SERVICES_TRANSFER_NOTIFICATION_BOARD_H_
#define FERRY_SERVICES_TRANSFER_NOTIFICATION_BOARD_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_metrics.h"

namespace ferry {
namespace transfer {

class NotificationBoard {
 public:
  // `metrics` (may be null) must outlive the board; outcomes are labelled `transport`.
  NotificationBoard(absl::Duration early_ttl, size_t max_early, TransferMetrics* metrics,
                    std::string transport);
  // Shutdown().
  ~NotificationBoard();
  NotificationBoard(const NotificationBoard&) = delete;
  NotificationBoard& operator=(const NotificationBoard&) = delete;

  // See KvTransport::AwaitNotification. After Shutdown, `done` gets CANCELLED.
  void Await(const std::string& transfer_id, absl::Time deadline, DoneCallback done);
  // A peer's outcome for `transfer_id`. A second outcome for an id already delivered or kept is
  // dropped (the first one stands).
  void Deliver(const std::string& transfer_id, absl::Status status);
  // Fails every pending await with CANCELLED, runs the callbacks, stops the thread. Idempotent.
  void Shutdown();

  // Awaits not yet resolved, and outcomes kept for awaits to come (for tests).
  size_t pending_awaits() const;
  size_t early_outcomes() const;

 private:
  struct Waiter {
    absl::Time deadline;
    DoneCallback done;
  };
  struct Early {
    absl::Status status;
    absl::Time expires;
  };

  void Loop();
  // Queues a callback for the board's thread.
  void Fire(DoneCallback done, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration early_ttl_;
  const size_t max_early_;
  TransferMetrics* const metrics_;
  const std::string transport_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A new await: the thread recomputes its wake-up time.
  bool kick_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Early> early_ ABSL_GUARDED_BY(mu_);
  // Ids of early_ in arrival order (entries whose outcome was taken or expired are skipped).
  std::deque<std::string> early_order_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<DoneCallback, absl::Status>> ready_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace transfer
}  // namespace ferry

#endif  // FERRY_SERVICES_TRANSFER_NOTIFICATION_BOARD_H_
