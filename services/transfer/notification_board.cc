#include "services/transfer/notification_board.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace transfer {

NotificationBoard::NotificationBoard(absl::Duration early_ttl, size_t max_early,
                                     TransferMetrics* metrics, std::string transport)
    : early_ttl_(early_ttl),
      max_early_(std::max<size_t>(max_early, 1)),
      metrics_(metrics),
      transport_(std::move(transport)) {
  thread_ = std::thread([this] { Loop(); });
}

NotificationBoard::~NotificationBoard() { Shutdown(); }

void NotificationBoard::Fire(DoneCallback done, absl::Status status) {
  ready_.emplace_back(std::move(done), std::move(status));
}

void NotificationBoard::Await(const std::string& transfer_id, absl::Time deadline,
                              DoneCallback done) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      auto it = early_.find(transfer_id);
      if (it != early_.end() && it->second.expires <= absl::Now()) {
        early_.erase(it);  // kept past its time: as if swept already
        it = early_.end();
      }
      if (it != early_.end()) {
        absl::Status status = std::move(it->second.status);
        early_.erase(it);
        if (metrics_ != nullptr) metrics_->RecordNotification(transport_, status);
        Fire(std::move(done), std::move(status));
      } else if (waiters_.count(transfer_id) != 0) {
        Fire(std::move(done), absl::AlreadyExistsError(
                                  absl::StrCat("transfer '", transfer_id, "' is already awaited")));
      } else {
        waiters_[transfer_id] = Waiter{deadline, std::move(done)};
        kick_ = true;  // the thread may sleep past this deadline: let it recompute
      }
      return;
    }
  }
  // The board's thread may be gone: the transport is shutting down.
  done(absl::CancelledError("KV transport is shutting down"));
}

void NotificationBoard::Deliver(const std::string& transfer_id, absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  if (auto it = waiters_.find(transfer_id); it != waiters_.end()) {
    if (metrics_ != nullptr) metrics_->RecordNotification(transport_, status);
    Fire(std::move(it->second.done), std::move(status));
    waiters_.erase(it);
    return;
  }
  if (early_.count(transfer_id) != 0) return;
  while (early_.size() >= max_early_ && !early_order_.empty()) {
    early_.erase(early_order_.front());
    early_order_.pop_front();
  }
  early_[transfer_id] = Early{std::move(status), absl::Now() + early_ttl_};
  early_order_.push_back(transfer_id);
}

void NotificationBoard::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  thread_.join();
}

size_t NotificationBoard::pending_awaits() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

size_t NotificationBoard::early_outcomes() const {
  absl::MutexLock lock(&mu_);
  return early_.size();
}

void NotificationBoard::Loop() {
  mu_.Lock();
  while (true) {
    // Deadlines and expiries due now.
    const absl::Time now = absl::Now();
    absl::Time next = now + absl::Seconds(1);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (stopping_ || it->second.deadline <= now) {
        absl::Status status =
            stopping_ ? absl::CancelledError("KV transport is shutting down")
                      : absl::DeadlineExceededError(absl::StrCat(
                            "no outcome for transfer '", it->first, "' before its deadline"));
        if (metrics_ != nullptr) metrics_->RecordNotification(transport_, status);
        Fire(std::move(it->second.done), std::move(status));
        it = waiters_.erase(it);
      } else {
        next = std::min(next, it->second.deadline);
        ++it;
      }
    }
    while (!early_order_.empty()) {
      auto it = early_.find(early_order_.front());
      if (it == early_.end()) {
        early_order_.pop_front();
      } else if (it->second.expires <= now) {
        early_.erase(it);
        early_order_.pop_front();
      } else {
        next = std::min(next, it->second.expires);
        break;
      }
    }
    if (!ready_.empty()) {
      std::vector<std::pair<DoneCallback, absl::Status>> ready;
      ready.swap(ready_);
      mu_.Unlock();
      for (auto& [done, status] : ready) done(std::move(status));
      mu_.Lock();
      continue;
    }
    if (stopping_) break;
    auto wake = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || kick_ || !ready_.empty();
    };
    mu_.AwaitWithDeadline(absl::Condition(&wake), next);
    kick_ = false;
  }
  mu_.Unlock();
}

}  // namespace transfer
}  // namespace ferry
