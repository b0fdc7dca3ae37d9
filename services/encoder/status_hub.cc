#include "services/encoder/status_hub.h"

#include <string>
#include <utility>

#include "engine/common/log.h"

namespace ferry {

class StatusCall final : public grpc::ServerWriteReactor<ferry::v1::EncoderStatus> {
 public:
  StatusCall(StatusHub* hub, grpc::CallbackServerContext* context) : hub_(hub), context_(context) {}

  // Sends `status` if the stream is free and it is news (or the heartbeat is due).
  void Offer(const ferry::v1::EncoderStatus& status, absl::Time now, absl::Duration heartbeat) {
    absl::ReleasableMutexLock lock(&mu_);
    if (writing_ || finished_) return;
    if (cancelled_) return FinishLocked(grpc::Status::CANCELLED);
    if (closing_) return FinishLocked(Closed());
    std::string bytes = status.SerializeAsString();
    if (sent_ && bytes == last_ && now - last_time_ < heartbeat) return;
    out_ = status;
    last_ = std::move(bytes);
    last_time_ = now;
    sent_ = true;
    writing_ = true;
    lock.Release();
    StartWrite(&out_);
  }

  // Shutdown: finish now, or once the write in flight is done.
  void Close() {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (!writing_) FinishLocked(Closed());
  }

  void Cancel() { context_->TryCancel(); }

 private:
  static grpc::Status Closed() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the encoder is shutting down");
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) return FinishLocked(grpc::Status::CANCELLED);
    if (closing_) return FinishLocked(Closed());
    if (cancelled_) return FinishLocked(grpc::Status::CANCELLED);
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    hub_->Remove(this);
    delete this;
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  StatusHub* const hub_;
  grpc::CallbackServerContext* const context_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_ ABSL_GUARDED_BY(mu_);
  absl::Time last_time_ ABSL_GUARDED_BY(mu_);
  ferry::v1::EncoderStatus out_;  // written by StartWrite's caller only while !writing_
};

StatusHub::StatusHub(std::function<ferry::v1::EncoderStatus()> status, StatusHubOptions options)
    : status_(std::move(status)), options_(options) {
  ticker_ = std::thread([this] { Run(); });
}

StatusHub::~StatusHub() { Shutdown(); }

grpc::ServerWriteReactor<ferry::v1::EncoderStatus>* StatusHub::Subscribe(
    grpc::CallbackServerContext* context) {
  auto* call = new StatusCall(this, context);
  const ferry::v1::EncoderStatus status = status_();
  absl::MutexLock lock(&mu_);
  calls_.insert(call);
  if (stopping_) {
    call->Close();
    return call;
  }
  call->Offer(status, absl::Now(), options_.heartbeat);
  return call;
}

void StatusHub::Remove(StatusCall* call) {
  absl::MutexLock lock(&mu_);
  calls_.erase(call);
  changed_.SignalAll();
}

int64_t StatusHub::subscribers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(calls_.size());
}

void StatusHub::Tick() {
  absl::MutexLock lock(&mu_);
  tick_ = true;
  changed_.SignalAll();
}

void StatusHub::Offer() {
  const ferry::v1::EncoderStatus status = status_();
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  for (StatusCall* call : calls_) call->Offer(status, now, options_.heartbeat);
}

void StatusHub::Run() {
  for (;;) {
    Offer();
    absl::MutexLock lock(&mu_);
    const absl::Time until = absl::Now() + options_.interval;
    while (!stopping_ && !tick_ && !changed_.WaitWithDeadline(&mu_, until)) {
    }
    if (stopping_) return;
    tick_ = false;
  }
}

void StatusHub::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      for (StatusCall* call : calls_) call->Close();
      changed_.SignalAll();  // the ticker
      // Streams whose write cannot complete (a client that stopped reading) are cancelled.
      const absl::Time give_up = absl::Now() + absl::Seconds(1);
      while (!calls_.empty() && !changed_.WaitWithDeadline(&mu_, give_up)) {
      }
      if (!calls_.empty()) {
        LOG(INFO) << "watch: cancelling " << calls_.size() << " stream(s) that do not read";
        for (StatusCall* call : calls_) call->Cancel();
      }
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (!calls_.empty() && !changed_.WaitWithDeadline(&mu_, give_up)) {
    }
    if (!calls_.empty()) LOG(ERROR) << "watch: " << calls_.size() << " stream(s) did not end";
  }
  if (ticker_.joinable()) ticker_.join();
}

}  // namespace ferry
