#include "services/worker/watch_hub.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "kvstore/wire.h"

namespace ferry {

// One subscriber. Its state is guarded by mu_; at most one write is in flight (writing_), and a
// message is built only when the stream is free, so nothing queues up behind a slow reader.
class WatchCall final : public grpc::ServerWriteReactor<v1::WorkerStatus> {
 public:
  WatchCall(WatchHub* hub, grpc::CallbackServerContext* context, const v1::WatchRequest& request)
      : hub_(hub), context_(context) {
    const uint64_t incarnation = hub_->identity().incarnation();
    if (request.after_sequence() > 0 && request.incarnation() == incarnation) {
      cursor_ = request.after_sequence();  // a resumed stream: events after it, if still kept
      need_snapshot_ = false;
    }
  }

  // Sends the next message if the stream is free and there is one (`tick`: the ticker's call,
  // when load changes and heartbeats are due; otherwise only a backlog continues).
  void Continue(const v1::WorkerLoad& load, bool tick) {
    absl::ReleasableMutexLock lock(&mu_);
    if (writing_ || finished_) return;
    if (cancelled_) return FinishLocked(grpc::Status::CANCELLED);
    if (closing_) {
      return FinishLocked(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down"));
    }
    if (!tick && !more_) return;
    out_.Clear();
    if (!Compose(absl::Now(), load, &out_)) return;
    writing_ = true;
    lock.Release();
    StartWrite(&out_);
  }

  // Shutdown: finish now, or once the write in flight is done.
  void Close() {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    if (!writing_ && !finished_) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down"));
    }
  }

  // Refused before it started (the hub is stopping).
  void Refuse() {
    absl::MutexLock lock(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down"));
  }

  void Cancel() { context_->TryCancel(); }

 private:
  void OnWriteDone(bool ok) override {
    if (!ok) {  // the stream broke
      absl::MutexLock lock(&mu_);
      writing_ = false;
      FinishLocked(grpc::Status::CANCELLED);
      return;
    }
    const v1::WorkerLoad load = hub_->Load();
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
    }
    Continue(load, /*tick=*/false);
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_ && !finished_) FinishLocked(grpc::Status::CANCELLED);
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

  // Up to `room` hashes from the front of `from` into a STORED event of `out`.
  static size_t TakeStored(std::vector<Hash128>* from, size_t room, bool window,
                           v1::WorkerStatus* out) {
    const size_t n = std::min(room, from->size());
    if (n == 0) return 0;
    v1::KvEvent* e = out->add_kv_events();
    e->set_type(v1::KV_EVENT_TYPE_STORED);
    e->set_window_layers(window);
    for (size_t i = 0; i < n; ++i) kv::HashToProto((*from)[i], e->add_block_hashes());
    from->erase(from->begin(), from->begin() + static_cast<ptrdiff_t>(n));
    return n;
  }

  // The next message, or false when there is nothing to say yet.
  bool Compose(absl::Time now, const v1::WorkerLoad& load, v1::WorkerStatus* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const KvEventJournal& journal = hub_->engine_->kv_events();
    const size_t max = hub_->options_.max_hashes_per_message;
    *out = hub_->identity();
    out->set_drain_state(hub_->drain_state_());
    *out->mutable_load() = load;
    auto snapshot_part = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      size_t room = max;
      room -= TakeStored(&rest_, room, false, out);
      TakeStored(&rest_window_, room, true, out);
      more_ = !rest_.empty() || !rest_window_.empty();
    };
    if (more_ && (!rest_.empty() || !rest_window_.empty())) {
      out->set_sequence(cursor_);
      out->set_snapshot_continues(true);
      snapshot_part();
      return Sent(now, *out);
    }
    std::vector<JournalEvent> events;
    if (!need_snapshot_ && !journal.EventsAfter(cursor_, max, &events)) {
      need_snapshot_ = true;  // fell behind what the journal keeps
      lagged_ = true;
    }
    if (need_snapshot_) {
      JournalSnapshot snapshot = journal.Snapshot();
      need_snapshot_ = false;
      hub_->metrics_->WatchSnapshot(lagged_);
      lagged_ = false;
      cursor_ = snapshot.sequence;
      rest_ = std::move(snapshot.hashes);
      rest_window_ = std::move(snapshot.window_hashes);
      out->set_sequence(cursor_);
      out->set_snapshot(true);
      snapshot_part();
      last_load_ = load.SerializeAsString();
      return Sent(now, *out);
    }
    // Events in order, consecutive ones of one kind and cache in one KvEvent.
    v1::KvEvent* current = nullptr;
    for (const JournalEvent& e : events) {
      const v1::KvEventType type = e.kind == KvCacheEvent::Kind::kStored
                                       ? v1::KV_EVENT_TYPE_STORED
                                       : v1::KV_EVENT_TYPE_EVICTED;
      if (current == nullptr || current->type() != type || current->window_layers() != e.window) {
        current = out->add_kv_events();
        current->set_type(type);
        current->set_window_layers(e.window);
      }
      kv::HashToProto(e.hash, current->add_block_hashes());
      cursor_ = e.sequence;
    }
    more_ = events.size() == max;
    out->set_sequence(cursor_);
    std::string load_bytes = load.SerializeAsString();
    const bool changed = load_bytes != last_load_ || out->drain_state() != last_drain_;
    if (events.empty() && !changed) {
      if (now - last_sent_ < hub_->options_.heartbeat) return false;
      out->set_heartbeat(true);
    }
    last_load_ = std::move(load_bytes);
    return Sent(now, *out);
  }

  bool Sent(absl::Time now, const v1::WorkerStatus& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_sent_ = now;
    last_drain_ = out.drain_state();
    return true;
  }

  WatchHub* const hub_;
  grpc::CallbackServerContext* const context_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool need_snapshot_ ABSL_GUARDED_BY(mu_) = true;
  bool lagged_ ABSL_GUARDED_BY(mu_) = false;
  // A backlog (events or snapshot parts) waits for the next write.
  bool more_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t cursor_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Hash128> rest_ ABSL_GUARDED_BY(mu_);  // snapshot parts still to send
  std::vector<Hash128> rest_window_ ABSL_GUARDED_BY(mu_);
  std::string last_load_ ABSL_GUARDED_BY(mu_);
  v1::DrainState last_drain_ ABSL_GUARDED_BY(mu_) = v1::DRAIN_STATE_UNSPECIFIED;
  absl::Time last_sent_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The message being written: built under mu_ while no write is in flight, then read by gRPC
  // without the lock until OnWriteDone (writing_ keeps everyone else off it), so not annotated.
  v1::WorkerStatus out_;
};

WatchHub::WatchHub(const Engine* engine, LoadWindow* load, WorkerMetrics* metrics,
                   v1::WorkerStatus identity, std::function<v1::DrainState()> drain_state,
                   WatchHubOptions options)
    : engine_(engine),
      load_(load),
      metrics_(metrics),
      identity_(std::move(identity)),
      drain_state_(std::move(drain_state)),
      options_(options) {
  load_now_ = Load();
  ticker_ = std::thread([this] { Run(); });
}

WatchHub::~WatchHub() { Shutdown(); }

v1::WorkerLoad WatchHub::Load() {
  const EngineStats s = engine_->stats();
  const LoadSummary w = load_->Summary();
  v1::WorkerLoad load;
  load.set_queued_requests(static_cast<uint32_t>(s.waiting));
  load.set_queued_tokens(static_cast<uint64_t>(s.queued_tokens));
  load.set_running_requests(static_cast<uint32_t>(s.running));
  load.set_running_tokens(static_cast<uint64_t>(s.running_tokens));
  load.set_used_kv_blocks(static_cast<uint64_t>(s.total_blocks - s.free_blocks));
  load.set_free_kv_blocks(static_cast<uint64_t>(s.free_blocks));
  load.set_cached_kv_blocks(static_cast<uint64_t>(s.cached_blocks));
  load.set_step_time_ms(static_cast<float>(w.step_seconds * 1e3));
  load.set_prefill_tokens_per_second(static_cast<float>(w.prefill_tokens_per_second));
  load.set_decode_tokens_per_second(static_cast<float>(w.decode_tokens_per_second));
  load.set_busy_fraction(static_cast<float>(w.busy_fraction));
  return load;
}

grpc::ServerWriteReactor<v1::WorkerStatus>* WatchHub::Subscribe(
    grpc::CallbackServerContext* context, const v1::WatchRequest* request) {
  auto* call = new WatchCall(this, context, *request);
  const v1::WorkerLoad load = Load();  // the snapshot's load is current, not the last tick's
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    call->Refuse();
    return call;
  }
  calls_.insert(call);
  metrics_->WatchSubscribers(static_cast<int64_t>(calls_.size()));
  call->Continue(load, /*tick=*/true);
  return call;
}

void WatchHub::Remove(WatchCall* call) {
  absl::MutexLock lock(&mu_);
  calls_.erase(call);
  metrics_->WatchSubscribers(static_cast<int64_t>(calls_.size()));
  changed_.SignalAll();
}

int64_t WatchHub::subscribers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(calls_.size());
}

void WatchHub::Run() {
  mu_.Lock();
  while (!stopping_) {
    mu_.Unlock();
    v1::WorkerLoad load = Load();
    metrics_->Refresh(engine_->stats(), load.prefill_tokens_per_second(),
                      UtilisationOf(engine_->stats(), load_->Summary().busy_fraction,
                                    identity_.capacity().max_running_requests(),
                                    identity_.capacity().block_tokens()));
    mu_.Lock();
    if (stopping_) break;
    load_now_ = load;
    for (WatchCall* call : calls_) call->Continue(load_now_, /*tick=*/true);
    const absl::Time give_up = absl::Now() + options_.interval;
    while (!stopping_ && !changed_.WaitWithDeadline(&mu_, give_up)) {
    }
  }
  mu_.Unlock();
}

void WatchHub::Shutdown() {
  absl::ReleasableMutexLock lock(&mu_);
  if (!stopping_) {
    stopping_ = true;
    for (WatchCall* call : calls_) call->Close();
    // Streams whose write cannot complete (a client that stopped reading) are cancelled.
    const absl::Time give_up = absl::Now() + absl::Seconds(1);
    while (!calls_.empty() && !changed_.WaitWithDeadline(&mu_, give_up)) {
    }
    if (!calls_.empty()) {
      LOG(INFO) << "watch: cancelling " << calls_.size() << " stream(s) that do not read";
      for (WatchCall* call : calls_) call->Cancel();
    }
    changed_.SignalAll();  // the ticker
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!calls_.empty() && !changed_.WaitWithDeadline(&mu_, give_up)) {
  }
  if (!calls_.empty()) {
    LOG(ERROR) << "watch: " << calls_.size() << " stream(s) did not end";
  }
  lock.Release();
  if (ticker_.joinable()) ticker_.join();
}

}  // namespace ferry
