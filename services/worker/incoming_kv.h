// The decode side of one request's KV push: the blocks a decode worker reserved for KV that a
// prefill worker writes, and the outcomes of the transfers into them (ARCHITECTURE.md §3, §7).
//
//   auto kv = IncomingKv::Await(transport, pools, blocks, {id, window_id}, deadline, quarantine,
//                               landing,
//                               [](absl::Status s) { /* every push landed, or why not */ });
//   ... on OK: kv->Take() hands the blocks (one reference each) to a decode-only request.
//   ... on failure, or when the request ends first: kv->Abandon().
//
// Blocks a push can still reach are never reused: Abandon gives them back only once every
// transfer's outcome is known (it arrived, or the transport failed the await because the
// connection broke or it shut down). A transfer whose outcome has not arrived by the deadline is
// awaited again for `quarantine` more (its late outcome is kept for a new await by the
// transport); only then, with its initiator long past its own deadline (which is at most this
// reservation's, plus the transport's cancel grace), are the blocks given back, with an error
// logged.
//
// The pushes write the reservation's landing (the staging areas' host memory, or the blocks
// themselves in place; kv_handoff.h DescribeReservation): held as the blocks are, and once every
// push has landed committed into the blocks (a copy to the device when staged) before on_ready.
//
// Thread-safe. Callbacks run on the transport's notification thread; `on_ready` runs once.

#ifndef FERRY_SERVICES_WORKER_INCOMING_KV_H_
#define FERRY_SERVICES_WORKER_INCOMING_KV_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/kv/kv_block_pool.h"
#include "engine/kv/kv_staging.h"
#include "services/transfer/kv_transport.h"

namespace ferry {

class IncomingKv : public std::enable_shared_from_this<IncomingKv> {
 public:
  // Called with the number of blocks given back and whether the outcome was known (false: the
  // quarantine ran out), for metrics; may be empty.
  using ReleaseObserver = std::function<void(int64_t blocks, bool outcome_known)>;

  // What the pushes write (kv_handoff.h KvLanding).
  using Landing = std::vector<std::shared_ptr<KvHostBlocks>>;

  // Owns `blocks` (Engine::Reserve's references) and `landing` from here. The transport and
  // pools must outlive every IncomingKv.
  static std::shared_ptr<IncomingKv> Await(transfer::KvTransport* transport, KvBlockPool* pool,
                                           KvBlockPool* window_pool, KvReservation blocks,
                                           std::vector<std::string> transfer_ids,
                                           absl::Time deadline, absl::Duration quarantine,
                                           Landing landing,
                                           std::function<void(absl::Status)> on_ready,
                                           ReleaseObserver on_release = {});
  ~IncomingKv();

  // After on_ready(OK): the blocks, whose references now belong to the caller. Once.
  KvReservation Take();
  // The request will not use the blocks: they go back once no push can reach them. Idempotent;
  // nothing after Take.
  void Abandon();

  // The initiator says it never started a push: every outcome counts as known.
  void NoTransfer();

  // Whether the blocks are still held here (for tests and shutdown).
  bool holding() const;

  IncomingKv(transfer::KvTransport* transport, KvBlockPool* pool, KvBlockPool* window_pool,
             KvReservation blocks, absl::Duration quarantine, Landing landing,
             ReleaseObserver on_release);

 private:
  void Start(std::vector<std::string> ids, absl::Time deadline,
             std::function<void(absl::Status)> on_ready);
  void OnOutcome(size_t index, absl::Status status, bool second);
  // Gives the blocks back if they are abandoned and every outcome is known. Releases mu_ while
  // it gives them back, and holds it again on return.
  void MaybeRelease() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  transfer::KvTransport* const transport_;
  KvBlockPool* const pool_;
  KvBlockPool* const window_pool_;
  const absl::Duration quarantine_;
  const ReleaseObserver on_release_;

  mutable absl::Mutex mu_;
  KvReservation blocks_ ABSL_GUARDED_BY(mu_);
  Landing landing_ ABSL_GUARDED_BY(mu_);   // until committed, or released with the blocks
  bool held_ ABSL_GUARDED_BY(mu_) = true;  // blocks_ still ours
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> ids_ ABSL_GUARDED_BY(mu_);
  // The transfer's outcome arrived (or will never come).
  std::vector<bool> known_ ABSL_GUARDED_BY(mu_);
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;  // a quarantine ran out
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  size_t ok_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<void(absl::Status)> on_ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_INCOMING_KV_H_
