#include "services/worker/incoming_kv.h"

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"

namespace ferry {

std::shared_ptr<IncomingKv> IncomingKv::Await(transfer::KvTransport* transport, KvBlockPool* pool,
                                              KvBlockPool* window_pool, KvReservation blocks,
                                              std::vector<std::string> transfer_ids,
                                              absl::Time deadline, absl::Duration quarantine,
                                              Landing landing,
                                              std::function<void(absl::Status)> on_ready,
                                              ReleaseObserver on_release) {
  auto kv = std::make_shared<IncomingKv>(transport, pool, window_pool, std::move(blocks),
                                         quarantine, std::move(landing), std::move(on_release));
  kv->Start(std::move(transfer_ids), deadline, std::move(on_ready));
  return kv;
}

IncomingKv::IncomingKv(transfer::KvTransport* transport, KvBlockPool* pool,
                       KvBlockPool* window_pool, KvReservation blocks, absl::Duration quarantine,
                       Landing landing, ReleaseObserver on_release)
    : transport_(transport),
      pool_(pool),
      window_pool_(window_pool),
      quarantine_(quarantine),
      on_release_(std::move(on_release)),
      blocks_(std::move(blocks)),
      landing_(std::move(landing)) {}

IncomingKv::~IncomingKv() {
  // Every await has fired (each holds a reference): no push can reach the blocks any more.
  absl::MutexLock lock(&mu_);
  abandoned_ = true;
  for (size_t i = 0; i < known_.size(); ++i) known_[i] = true;
  MaybeRelease();
}

void IncomingKv::Start(std::vector<std::string> ids, absl::Time deadline,
                       std::function<void(absl::Status)> on_ready) {
  {
    absl::MutexLock lock(&mu_);
    ids_ = ids;
    known_.assign(ids.size(), false);
    on_ready_ = std::move(on_ready);
  }
  auto self = shared_from_this();
  for (size_t i = 0; i < ids.size(); ++i) {
    transport_->AwaitNotification(ids[i], deadline, [self, i](absl::Status status) {
      self->OnOutcome(i, std::move(status), /*second=*/false);
    });
  }
}

void IncomingKv::OnOutcome(size_t index, absl::Status status, bool second) {
  std::function<void(absl::Status)> ready;
  absl::Status ready_status;
  bool await_again = false;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    id = ids_[index];
    if (second) {
      // (Known already when the initiator said it never pushed: nothing was late.)
      if (status.code() == absl::StatusCode::kDeadlineExceeded && !known_[index]) {
        timed_out_ = true;
        LOG(ERROR) << "transfer " << id << ": no outcome " << absl::FormatDuration(quarantine_)
                   << " after its deadline; its blocks are given back";
      }
      known_[index] = true;
    } else if (status.ok()) {
      known_[index] = true;
      if (++ok_ == ids_.size() && on_ready_) {
        ready = std::move(on_ready_);
        on_ready_ = nullptr;
        // Every push landed: into the blocks before on_ready, under mu_ so that no Abandon can
        // give the blocks back meanwhile (Commit takes only leaf locks: the pool's, the
        // backend's copy). Abandoned already: nobody reads them, and they go back below.
        if (!abandoned_) {
          for (const auto& host : landing_) {
            absl::Status committed = host->Commit();
            if (!committed.ok() && ready_status.ok()) ready_status = committed;
          }
        }
        landing_.clear();  // no push can write it any more: its slots go back
      }
    } else {
      // DEADLINE_EXCEEDED may be this await's own deadline (the push may still be running) or
      // the initiator's report: either way, wait for a later outcome before the blocks go back.
      await_again = status.code() == absl::StatusCode::kDeadlineExceeded && !known_[index];
      known_[index] = !await_again;
      if (on_ready_) {
        ready = std::move(on_ready_);
        on_ready_ = nullptr;
        ready_status = status;
      }
    }
    if (!await_again) MaybeRelease();
  }
  if (await_again) {
    auto self = shared_from_this();
    transport_->AwaitNotification(id, absl::Now() + quarantine_, [self, index](absl::Status s) {
      self->OnOutcome(index, std::move(s), /*second=*/true);
    });
  }
  if (ready) ready(ready_status);
}

KvReservation IncomingKv::Take() {
  absl::MutexLock lock(&mu_);
  CHECK(held_ && !abandoned_) << "IncomingKv::Take after Take or Abandon";
  held_ = false;
  return std::move(blocks_);
}

void IncomingKv::Abandon() {
  absl::MutexLock lock(&mu_);
  if (!held_ || abandoned_) return;
  abandoned_ = true;
  MaybeRelease();
}

void IncomingKv::NoTransfer() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < known_.size(); ++i) known_[i] = true;
  MaybeRelease();
}

bool IncomingKv::holding() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void IncomingKv::MaybeRelease() {
  if (!abandoned_ || !held_) return;
  for (bool known : known_) {
    if (!known) return;
  }
  held_ = false;
  KvReservation blocks = std::move(blocks_);
  Landing landing = std::move(landing_);
  landing_.clear();
  const bool known = !timed_out_;
  mu_.Unlock();
  landing.clear();  // no push can reach it: its slots go back
  std::vector<BlockId> held;
  for (BlockId b : blocks.blocks) {
    if (b != kNoBlock) held.push_back(b);
  }
  CHECK_OK(pool_->Release(held));
  int64_t released = static_cast<int64_t>(held.size());
  if (window_pool_ != nullptr) {
    held.clear();
    for (BlockId b : blocks.window_blocks) {
      if (b != kNoBlock) held.push_back(b);
    }
    CHECK_OK(window_pool_->Release(held));
    released += static_cast<int64_t>(held.size());
  }
  if (on_release_) on_release_(released, known);
  mu_.Lock();
}

}  // namespace ferry
