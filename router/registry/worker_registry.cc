#include "router/registry/worker_registry.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "router/index/kv_event_feed.h"
#include "services/common/grpc_client.h"
#include "services/common/shared_token.h"

namespace ferry {

struct WorkerRegistry::Worker {
  enum class State { kDown, kConnecting, kUp, kRefused };
  std::string address;
  std::shared_ptr<v1::Worker::Stub> stub;
  State state = State::kDown;
  std::string reason = "not connected yet";
  bool accepted = false;
  bool judged = false;      // this stream's first status was checked against the pool
  v1::WorkerStatus status;  // identity and load, as last reported
  absl::Duration last_seen;
  absl::Duration connected_at;
  absl::Duration next_attempt;
  Subscription* subscription = nullptr;
  uint64_t generation = 0;
  std::string cancel_reason;  // why the registry cancelled the stream, for its OnDone
  bool resync = false;        // it was cancelled for a KV event gap: resubscribe at once
  bool removed = false;       // in removed_: no longer listed, its stream ending
  int64_t inflight = 0;
  int64_t pending_prefill_tokens = 0;
  int64_t active_tokens = 0;
  int64_t messages = 0;
  // The registry's report stamp (report_stamp_) of its last message that carried its load: a
  // later report of any worker, a re-added one's included, has a larger one.
  uint64_t load_reports = 0;
  int64_t unreported_kv_tokens = 0;  // active tokens the router added since the last report
  // The last measurements (an idle window reports none; the worker's speed has not changed).
  double prefill_tokens_per_second = 0;
  double step_time_ms = 0;
  // Its KV events into the index; touched only by its stream's callbacks (one stream at a time)
  // and by Connect between streams.
  std::unique_ptr<KvEventFeed> feed;
  // The feed's state for ToJson, copied under the registry's lock.
  bool kv_synced = false;
  uint64_t kv_sequence = 0;
  int64_t kv_snapshots = 0, kv_gaps = 0;

  std::string id() const { return status.worker_id().empty() ? address : status.worker_id(); }
};

namespace {

// A worker's role as GET /workers names it (an unspecified role serves whole requests).
const char* WorkerRoleName(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return "prefill";
    case v1::WORKER_ROLE_DECODE:
      return "decode";
    default:
      return "aggregated";
  }
}

}  // namespace

const char* StateName(int state) {
  switch (state) {
    case 0:
      return "down";
    case 1:
      return "connecting";
    case 2:
      return "up";
    default:
      return "refused";
  }
}

// One Watch stream to one worker, on the registry's CompletionThread: StartCall, Read after Read
// until one fails, Finish. Deletes itself when done.
class WorkerRegistry::Subscription final {
 public:
  Subscription(WorkerRegistry* registry, Worker* worker, uint64_t generation,
               const SharedToken& token, v1::WatchRequest request)
      : registry_(registry),
        worker_(worker),
        generation_(generation),
        request_(std::move(request)) {
    AttachSharedToken(&context_, token);
    TraceId();
  }

  void Start(v1::Worker::Stub* stub, CompletionThread* completions) {
    reader_ = stub->PrepareAsyncWatch(&context_, request_, completions->queue());
    reader_->StartCall(&on_started_);
  }

  void Cancel() { context_.TryCancel(); }

 private:
  void OnStarted(bool ok) {
    if (!ok) return reader_->Finish(&result_, &on_finished_);
    reader_->Read(&status_, &on_read_);
  }

  void OnRead(bool ok) {
    if (!ok) return reader_->Finish(&result_, &on_finished_);  // the stream ended: how?
    registry_->OnStatus(worker_, status_);
    status_.Clear();
    reader_->Read(&status_, &on_read_);
  }

  void OnFinished(bool) {
    WorkerRegistry* const registry = registry_;
    registry->OnStreamDone(worker_, generation_,
                           result_.ok()
                               ? "the stream ended"
                               : absl::StrCat("the stream failed: ", result_.error_message()));
    delete this;
    // Only now may Stop return: the call's context is gone, so nothing of this stream outlives
    // the registry (a context deleted while the process tore gRPC down tripped its refcounts).
    registry->SubscriptionGone();
  }

  void TraceId() { context_.AddMetadata(kTraceIdMetadataKey, "router-watch"); }

  WorkerRegistry* const registry_;
  Worker* const worker_;
  const uint64_t generation_;
  grpc::ClientContext context_;
  const v1::WatchRequest request_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::WorkerStatus>> reader_;
  MethodTag<Subscription> on_started_{this, &Subscription::OnStarted};
  MethodTag<Subscription> on_read_{this, &Subscription::OnRead};
  MethodTag<Subscription> on_finished_{this, &Subscription::OnFinished};
  grpc::Status result_;
  v1::WorkerStatus status_;
};

WorkerRegistry::WorkerRegistry(std::vector<std::string> addresses, RegistryOptions options,
                               Clock* clock)
    : options_(std::move(options)), clock_(clock) {
  completions_ = options_.completions;
  if (completions_ == nullptr) {
    own_completions_ = std::make_unique<CompletionThread>("registry");
    completions_ = own_completions_.get();
  }
  index_ = options_.index;
  if (index_ == nullptr) {
    own_index_ = std::make_unique<KvIndex>();
    index_ = own_index_.get();
  }
  for (const std::string& address : addresses) {
    const bool listed = std::any_of(workers_.begin(), workers_.end(),
                                    [&](const auto& w) { return w->address == address; });
    if (!listed) workers_.push_back(NewWorker(address));
  }
}

WorkerRegistry::~WorkerRegistry() { Stop(); }

std::unique_ptr<WorkerRegistry::Worker> WorkerRegistry::NewWorker(const std::string& address) {
  auto w = std::make_unique<Worker>();
  w->address = address;
  w->feed = std::make_unique<KvEventFeed>(index_, index_->AddWorker());
  // A known worker's address: its channel tries to connect again at a short fixed interval, not
  // gRPC's growing backoff, so a restarted worker is seen within the interval.
  ChannelOptions channel;
  channel.max_reconnect_backoff = options_.reconnect_interval;
  w->stub = v1::Worker::NewStub(NewChannel(address, channel));
  return w;
}

void WorkerRegistry::Forget(std::unique_ptr<Worker> w) {
  index_->RemoveWorker(w->feed->slot());
  LOG(INFO) << "worker " << w->id() << " (" << w->address << ") is gone from the registry";
}

absl::Status WorkerRegistry::SetWorkers(std::vector<std::string> addresses) {
  for (const std::string& address : addresses) {
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
      return absl::InvalidArgumentError(absl::StrCat("'", address, "' is not host:port"));
    }
  }
  std::vector<std::unique_ptr<Worker>> gone;  // freed outside the lock
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::FailedPreconditionError("the registry is stopping");
    auto given = [&](const std::string& address) {
      return std::find(addresses.begin(), addresses.end(), address) != addresses.end();
    };
    std::vector<std::unique_ptr<Worker>> kept;
    for (auto& w : workers_) {
      if (given(w->address)) {
        kept.push_back(std::move(w));
        continue;
      }
      // No new work from now on, and no transition: its streams are the dispatcher's.
      LOG(INFO) << "worker " << w->id() << " (" << w->address
                << ") removed from the list: no new requests; requests streaming from it go on";
      w->removed = true;
      w->accepted = false;
      w->state = Worker::State::kDown;
      w->reason = "removed from the worker list";
      if (w->subscription != nullptr) {
        w->cancel_reason = w->reason;
        w->subscription->Cancel();
        removed_.push_back(std::move(w));  // until its stream's OnDone
      } else {
        gone.push_back(std::move(w));
      }
    }
    workers_ = std::move(kept);
    for (const std::string& address : addresses) {
      const bool listed = std::any_of(workers_.begin(), workers_.end(),
                                      [&](const auto& w) { return w->address == address; });
      if (listed) continue;
      workers_.push_back(NewWorker(address));
      LOG(INFO) << "worker " << address << " added to the list";
      if (started_) Connect(*workers_.back());
    }
    if (std::none_of(workers_.begin(), workers_.end(), [](const auto& x) { return x->accepted; })) {
      pool_ = PoolInfo();
    }
  }
  for (auto& w : gone) Forget(std::move(w));
  Changed();
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> WorkerRegistry::ReadWorkerFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the worker file ", path));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    const std::string trimmed(absl::StripAsciiWhitespace(line.substr(0, line.find('#'))));
    if (trimmed.empty()) continue;
    if (trimmed.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": '", trimmed, "' is not host:port"));
    }
    out.push_back(trimmed);
  }
  return out;
}

void WorkerRegistry::Start() {
  absl::MutexLock lock(&mu_);
  if (started_) return;
  started_ = true;
  for (auto& w : workers_) Connect(*w);
  monitor_ = std::thread([this] { MonitorLoop(); });
}

void WorkerRegistry::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
    for (auto* list : {&workers_, &removed_}) {
      for (auto& w : *list) {
        if (w->subscription != nullptr) w->subscription->Cancel();
      }
    }
    stop_cv_.SignalAll();
    // Every stream's OnDone has run, and its Subscription is deleted, before the registry goes.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (live_subscriptions_ != 0 && !stop_cv_.WaitWithDeadline(&mu_, give_up)) {
    }
  }
  if (monitor_.joinable()) monitor_.join();
}

void WorkerRegistry::Connect(Worker& w) {
  if (w.state != Worker::State::kRefused) w.state = Worker::State::kConnecting;
  w.judged = false;
  w.connected_at = clock_->Monotonic();
  ++w.generation;
  w.subscription = new Subscription(this, &w, w.generation, options_.auth_token, w.feed->resume());
  ++live_subscriptions_;
  w.subscription->Start(w.stub.get(), completions_);
}

void WorkerRegistry::MarkDown(Worker& w, const std::string& why) {
  if (w.state == Worker::State::kUp) {
    LOG(WARNING) << "worker " << w.id() << " (" << w.address << ") is down: " << why;
    transitions_.emplace_back(w.id(), false);
  }
  if (w.state != Worker::State::kRefused) {
    w.state = Worker::State::kDown;
    w.reason = why;
  }
  w.accepted = false;
  w.next_attempt = clock_->Monotonic() + options_.reconnect_interval;
  // The pool's facts hold while one accepted worker is left.
  if (std::none_of(workers_.begin(), workers_.end(), [](const auto& x) { return x->accepted; })) {
    pool_ = PoolInfo();
  }
}

void WorkerRegistry::OnStatus(Worker* w, const v1::WorkerStatus& status) {
  // The KV events first, outside the registry's lock: a large snapshot never holds up the
  // candidates' reads (the index has locks of its own).
  std::string gap;
  const bool applied = w->feed->Apply(status, &gap) == KvEventFeed::Result::kApplied;
  bool changed = false;
  bool refused = false;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || w->removed) return;
    w->kv_synced = w->feed->synced();
    w->kv_sequence = w->feed->sequence();
    w->kv_snapshots = w->feed->snapshots();
    w->kv_gaps = w->feed->gaps();
    if (!applied) {
      // Resubscribe from what the index holds: the worker resends what it still keeps, or a
      // snapshot.
      LOG(WARNING) << "worker " << w->id() << " (" << w->address << "): KV events do not add up ("
                   << gap << "); resubscribing";
      if (w->subscription != nullptr) {
        w->cancel_reason = absl::StrCat("KV event gap: ", gap);
        w->resync = true;
        w->subscription->Cancel();
      }
      return;
    }
    w->last_seen = clock_->Monotonic();
    ++w->messages;
    if (status.snapshot() || w->messages == 1) {
      w->load_reports = ++report_stamp_;
      w->unreported_kv_tokens = 0;
      // Identity: keep the whole message but its (possibly large) hash lists.
      w->status = status;
      w->status.clear_kv_events();
    } else if (!status.snapshot_continues()) {
      w->load_reports = ++report_stamp_;
      w->unreported_kv_tokens = 0;
      *w->status.mutable_load() = status.load();
      w->status.set_drain_state(status.drain_state());
      w->status.set_sequence(status.sequence());
    }
    if (status.load().prefill_tokens_per_second() > 0) {
      w->prefill_tokens_per_second = status.load().prefill_tokens_per_second();
    }
    if (status.load().step_time_ms() > 0) w->step_time_ms = status.load().step_time_ms();
    if (!w->accepted && !w->judged) {
      w->judged = true;
      const v1::WorkerStatus& s = w->status;
      const Hash128 fp{s.model().fingerprint().lo(), s.model().fingerprint().hi()};
      const bool pinned = options_.fingerprint != Hash128{};
      std::string refusal;
      if (s.protocol_version() != v1::PROTOCOL_VERSION_1) {
        refusal = "protocol";
      } else if ((pinned && fp != options_.fingerprint) ||
                 (pool_.known && fp != pool_.fingerprint)) {
        refusal = "fingerprint";
      } else if (pool_.known && s.capacity().block_tokens() != pool_.block_tokens) {
        refusal = "block_tokens";
      }
      if (!refusal.empty()) {
        const std::string reason =
            refusal != "fingerprint"
                ? absl::StrCat("refused: its ", refusal, " differs from the pool's")
                : absl::StrCat("refused: its fingerprint ", fp.ToHex(), " is not the pool's ",
                               (pinned ? options_.fingerprint : pool_.fingerprint).ToHex());
        if (w->state != Worker::State::kRefused || w->reason != reason) {
          LOG(WARNING) << "worker " << w->id() << " (" << w->address << ") " << reason;
          refusals_.push_back(refusal);
        }
        w->state = Worker::State::kRefused;
        w->reason = reason;
        refused = true;
        if (w->subscription != nullptr) {
          w->cancel_reason = w->reason;
          w->subscription->Cancel();
        }
      } else {
        if (!pool_.known) {
          pool_.known = true;
          pool_.fingerprint = fp;
          pool_.model_name = s.model().name();
          pool_.block_tokens = s.capacity().block_tokens();
          pool_.max_context_tokens = s.capacity().max_context_tokens();
          pool_.max_choices = s.capacity().max_choices();
        }
        pool_.max_choices = std::min(pool_.max_choices, s.capacity().max_choices());
        pool_.max_context_tokens =
            std::min(pool_.max_context_tokens, s.capacity().max_context_tokens());
        last_pool_ = pool_;
        w->accepted = true;
        if (w->state != Worker::State::kUp) transitions_.emplace_back(w->id(), true);
        w->state = Worker::State::kUp;
        w->reason.clear();
        LOG(INFO) << "worker " << w->id() << " (" << w->address << ") is up: " << s.model().name()
                  << ", " << s.capacity().total_kv_blocks() << " KV blocks, engine " << s.engine();
      }
    }
    changed = true;
  }
  if (refused) w->feed->Reset();  // its blocks are of no use to this pool
  if (changed) Changed();
}

void WorkerRegistry::OnStreamDone(Worker* w, uint64_t generation, const std::string& why) {
  std::unique_ptr<Worker> gone;  // a removed worker, now that nothing points at it
  {
    absl::MutexLock lock(&mu_);
    if (w->generation == generation && w->removed) {
      w->subscription = nullptr;
      auto it = std::find_if(removed_.begin(), removed_.end(),
                             [w](const auto& x) { return x.get() == w; });
      if (it != removed_.end()) {
        gone = std::move(*it);
        removed_.erase(it);
      }
    } else if (w->generation == generation) {
      w->subscription = nullptr;
      w->messages = 0;
      if (!stopping_) {
        MarkDown(*w, w->cancel_reason.empty() ? why : w->cancel_reason);
        // A gap says nothing of the worker's health: no backoff before the new stream.
        if (w->resync) w->next_attempt = clock_->Monotonic();
      }
      w->cancel_reason.clear();
      w->resync = false;
    }
    stop_cv_.SignalAll();
  }
  if (gone != nullptr) Forget(std::move(gone));
  Changed();
}

void WorkerRegistry::SubscriptionGone() {
  absl::MutexLock lock(&mu_);
  --live_subscriptions_;
  stop_cv_.SignalAll();
}

void WorkerRegistry::MonitorLoop() {
  mu_.Lock();
  while (!stopping_) {
    const absl::Duration now = clock_->Monotonic();
    for (auto& w : workers_) {
      const bool live = w->state == Worker::State::kUp || w->state == Worker::State::kConnecting ||
                        (w->state == Worker::State::kRefused && !w->judged);
      const absl::Duration since =
          now - (w->state == Worker::State::kUp ? w->last_seen : w->connected_at);
      if (live && w->subscription != nullptr && since > options_.heartbeat_timeout) {
        // Silent: cancel; its OnDone marks it down and schedules the next try.
        w->cancel_reason = absl::StrCat("no message for ", absl::FormatDuration(since));
        if (w->state == Worker::State::kUp) {
          LOG(WARNING) << "worker " << w->id() << " (" << w->address << "): " << w->cancel_reason;
          transitions_.emplace_back(w->id(), false);
        }
        if (w->state != Worker::State::kRefused) {  // no new work, and why, from now on
          w->state = Worker::State::kDown;
          w->reason = w->cancel_reason;
        }
        w->accepted = false;
        w->subscription->Cancel();
      } else if (w->subscription == nullptr && now >= w->next_attempt) {
        Connect(*w);
      }
    }
    std::vector<std::string> refusals;
    refusals.swap(refusals_);
    mu_.Unlock();
    for (const std::string& reason : refusals) {
      if (on_refusal_) on_refusal_(reason);
    }
    ReportTransitions();
    mu_.Lock();
    const absl::Time next_check = absl::Now() + options_.check_interval;
    while (!stopping_ && !stop_cv_.WaitWithDeadline(&mu_, next_check)) {
    }
  }
  mu_.Unlock();
}

void WorkerRegistry::Changed() {
  ReportTransitions();
  std::function<void()> callback;
  {
    absl::MutexLock lock(&mu_);
    callback = on_change_;
  }
  if (callback) callback();
}

void WorkerRegistry::ReportTransitions() {
  absl::MutexLock report(&report_mu_);
  std::vector<std::pair<std::string, bool>> transitions;
  std::function<void(const std::string&, bool)> callback;
  {
    absl::MutexLock lock(&mu_);
    transitions.swap(transitions_);
    callback = on_worker_state_;
  }
  if (!callback) return;
  for (const auto& [id, up] : transitions) callback(id, up);
}

void WorkerRegistry::SetOnWorkerState(std::function<void(const std::string&, bool)> callback) {
  absl::MutexLock lock(&mu_);
  on_worker_state_ = std::move(callback);
}

void WorkerRegistry::SetOnChange(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  on_change_ = std::move(callback);
}

void WorkerRegistry::SetOnRefusal(std::function<void(const std::string&)> callback) {
  absl::MutexLock lock(&mu_);
  on_refusal_ = std::move(callback);
}

std::vector<Candidate> WorkerRegistry::Candidates() const {
  absl::MutexLock lock(&mu_);
  std::vector<Candidate> out;
  for (const auto& w : workers_) {
    if (!w->accepted || w->state != Worker::State::kUp) continue;
    const v1::DrainState drain = w->status.drain_state();
    if (drain == v1::DRAIN_STATE_DRAINING || drain == v1::DRAIN_STATE_DRAINED) continue;
    const v1::WorkerCapacity& c = w->status.capacity();
    const int64_t capacity =
        static_cast<int64_t>(c.max_running_requests()) + c.max_queued_requests();
    if (capacity > 0 && w->inflight >= capacity) continue;
    Candidate candidate;
    candidate.id = w->id();
    candidate.stub = w->stub;
    candidate.load.id = w->id();
    candidate.load.inflight = w->inflight;
    candidate.load.queued_tokens = static_cast<int64_t>(w->status.load().queued_tokens());
    candidate.load.running_tokens = static_cast<int64_t>(w->status.load().running_tokens());
    candidate.load.free_kv_blocks = static_cast<int64_t>(w->status.load().free_kv_blocks());
    candidate.load.total_kv_blocks = static_cast<int64_t>(c.total_kv_blocks());
    candidate.load.cached_kv_blocks = static_cast<int64_t>(w->status.load().cached_kv_blocks());
    candidate.load.load_reports = w->load_reports;
    candidate.load.unreported_kv_tokens = w->unreported_kv_tokens;
    candidate.load.pending_prefill_tokens = w->pending_prefill_tokens;
    candidate.load.active_tokens = w->active_tokens;
    candidate.load.prefill_tokens_per_second = w->prefill_tokens_per_second;
    candidate.load.step_time_ms = w->step_time_ms;
    candidate.load.max_window = c.max_window();
    candidate.load.slot = w->feed->slot();
    candidate.role = w->status.role() == v1::WORKER_ROLE_UNSPECIFIED ? v1::WORKER_ROLE_AGGREGATED
                                                                     : w->status.role();
    candidate.load.kind = candidate.role == v1::WORKER_ROLE_PREFILL  ? WorkerKind::kPrefill
                          : candidate.role == v1::WORKER_ROLE_DECODE ? WorkerKind::kDecode
                                                                     : WorkerKind::kAggregated;
    candidate.endpoint = w->status.endpoint().empty() ? w->address : w->status.endpoint();
    out.push_back(std::move(candidate));
  }
  return out;
}

bool WorkerRegistry::AnyUp() const {
  absl::MutexLock lock(&mu_);
  bool aggregated = false, prefill = false, decode = false;
  for (const auto& w : workers_) {
    const v1::DrainState drain = w->status.drain_state();
    if (!w->accepted || w->state != Worker::State::kUp || drain == v1::DRAIN_STATE_DRAINING ||
        drain == v1::DRAIN_STATE_DRAINED) {
      continue;
    }
    switch (w->status.role()) {
      case v1::WORKER_ROLE_PREFILL:
        prefill = true;
        break;
      case v1::WORKER_ROLE_DECODE:
        decode = true;
        break;
      default:
        aggregated = true;
    }
  }
  return aggregated || (prefill && decode);
}

int64_t WorkerRegistry::up_count() const {
  absl::MutexLock lock(&mu_);
  return std::count_if(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->accepted && w->state == Worker::State::kUp; });
}

PoolInfo WorkerRegistry::pool() const {
  absl::MutexLock lock(&mu_);
  return pool_;
}

PoolInfo WorkerRegistry::last_pool() const {
  absl::MutexLock lock(&mu_);
  return pool_.known ? pool_ : last_pool_;
}

std::shared_ptr<v1::Worker::Stub> WorkerRegistry::UpStub(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->id() == id && w->accepted && w->state == Worker::State::kUp) return w->stub;
  }
  return nullptr;
}

uint64_t WorkerRegistry::LoadReports(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  for (const auto& w : workers_) {
    if (w->id() == id) return w->load_reports;
  }
  return 0;
}

void WorkerRegistry::AddLoad(const std::string& id, int requests, int64_t pending_prefill_tokens,
                             int64_t active_tokens) {
  absl::MutexLock lock(&mu_);
  for (auto& w : workers_) {
    if (w->id() == id) {
      w->inflight = std::max<int64_t>(0, w->inflight + requests);
      w->pending_prefill_tokens =
          std::max<int64_t>(0, w->pending_prefill_tokens + pending_prefill_tokens);
      w->active_tokens = std::max<int64_t>(0, w->active_tokens + active_tokens);
      if (active_tokens > 0) w->unreported_kv_tokens += active_tokens;
      return;
    }
  }
}

absl::StatusOr<v1::DrainResponse> WorkerRegistry::Drain(const std::string& id,
                                                        uint32_t grace_seconds) {
  std::shared_ptr<v1::Worker::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    for (auto& w : workers_) {
      if (w->id() == id || w->address == id) stub = w->stub;
    }
  }
  if (stub == nullptr) return absl::NotFoundError(absl::StrCat("no worker '", id, "'"));
  v1::DrainRequest request;
  request.set_grace_seconds(grace_seconds);
  v1::DrainResponse response;
  auto context = NewClientContext(absl::Seconds(10));
  AttachSharedToken(context.get(), options_.auth_token);
  const grpc::Status status = stub->Drain(context.get(), request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("worker ", id, ": ", status.error_message()));
  }
  return response;
}

nlohmann::json WorkerRegistry::ToJson() const {
  absl::MutexLock lock(&mu_);
  nlohmann::json out = nlohmann::json::array();
  const absl::Duration now = clock_->Monotonic();
  for (const auto& w : workers_) {
    const v1::WorkerStatus& s = w->status;
    const v1::WorkerLoad& l = s.load();
    nlohmann::json j = {
        {"id", w->id()},
        {"address", w->address},
        {"state", StateName(static_cast<int>(w->state))},
        {"accepted", w->accepted},
        {"reason", w->reason},
        {"inflight", w->inflight},
        {"streaming", w->subscription != nullptr},  // a status stream is open (or opening)
        {"messages", w->messages},                  // received on this stream
    };
    if (w->messages > 0 || w->state == Worker::State::kRefused) {
      j["role"] = WorkerRoleName(s.role());
      j["engine"] = s.engine();
      j["model"] = s.model().name();
      j["fingerprint"] =
          Hash128{s.model().fingerprint().lo(), s.model().fingerprint().hi()}.ToHex();
      j["drain_state"] = v1::DrainState_Name(s.drain_state());
      j["block_tokens"] = s.capacity().block_tokens();
      j["total_kv_blocks"] = s.capacity().total_kv_blocks();
      j["max_running_requests"] = s.capacity().max_running_requests();
      j["load"] = {{"queued_requests", l.queued_requests()},
                   {"running_requests", l.running_requests()},
                   {"queued_tokens", l.queued_tokens()},
                   {"running_tokens", l.running_tokens()},
                   {"used_kv_blocks", l.used_kv_blocks()},
                   {"free_kv_blocks", l.free_kv_blocks()},
                   {"cached_kv_blocks", l.cached_kv_blocks()},
                   {"step_time_ms", l.step_time_ms()},
                   {"prefill_tokens_per_second", l.prefill_tokens_per_second()},
                   {"decode_tokens_per_second", l.decode_tokens_per_second()},
                   {"busy_fraction", l.busy_fraction()}};
      j["last_message_ms_ago"] = absl::ToInt64Milliseconds(now - w->last_seen);
    }
    // What the router's KV index holds of it (blocks: its prefix cache's, as of `sequence`).
    j["kv_index"] = {{"blocks", index_->blocks(w->feed->slot())},
                     {"synced", w->kv_synced},
                     {"sequence", w->kv_sequence},
                     {"snapshots", w->kv_snapshots},
                     {"gaps", w->kv_gaps}};
    j["pending_prefill_tokens"] = w->pending_prefill_tokens;
    j["active_tokens"] = w->active_tokens;
    out.push_back(std::move(j));
  }
  for (const auto& w : removed_) {
    // Only what says where its stream is: it has no say in routing any more.
    out.push_back({{"id", w->id()},
                   {"address", w->address},
                   {"state", "removed"},
                   {"accepted", false},
                   {"reason", w->reason},
                   {"streaming", w->subscription != nullptr}});
  }
  return out;
}

}  // namespace ferry
