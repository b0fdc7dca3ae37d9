#include "router/dispatch/dispatcher.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "services/common/grpc_client.h"
#include "services/common/shared_token.h"

namespace ferry {

namespace v1 = ferry::v1;

class Dispatcher::Job {
 public:
  Job(DispatchRequest request, std::shared_ptr<GenerateSink> sink)
      : request(std::move(request)), sink(std::move(sink)) {}

  RouteRequest route() const {
    RouteRequest r;
    r.prompt_tokens = request.prompt_tokens + resumed_tokens;
    r.block_hashes = request.block_hashes;
    r.block_tokens = request.request.request().block_tokens();
    r.store_prefix_blocks = request.store_prefix_blocks;
    return r;
  }
  // The prompt tokens a worker must compute, as the policy expects it.
  int64_t Uncached(const RouteChoice& choice) const {
    return std::max<int64_t>(0, request.prompt_tokens + resumed_tokens -
                                    choice.predicted_local_tokens - choice.predicted_store_tokens);
  }
  // The request the next attempt sends: the client's, or after a migration, under its own id
  // with the resume point (and the source of a drain hand-off). Under the dispatcher's mu_.
  v1::GenerateRequest Attempt() const {
    v1::GenerateRequest r = request.request;
    r.clear_handoff_source_endpoint();
    r.clear_handoff_source_request_id();
    if (migrations == 0) return r;
    v1::RequestContext* context = r.mutable_request()->mutable_context();
    context->set_request_id(absl::StrCat(context->request_id(), ".m", migrations));
    *r.mutable_request()->mutable_resume() = resume;
    if (!handoff_endpoint.empty()) {
      r.set_handoff_source_endpoint(handoff_endpoint);
      r.set_handoff_source_request_id(handoff_request_id);
    }
    return r;
  }
  std::string attempt_id() const {
    const std::string& id = request.request.request().context().request_id();
    return migrations == 0 ? id : absl::StrCat(id, ".m", migrations);
  }

  const DispatchRequest request;
  const std::shared_ptr<GenerateSink> sink;
  // Under the dispatcher's mu_.
  int attempts = 0;
  std::set<std::string> excluded;  // workers that failed it
  bool queued = false;
  bool cancelled = false;
  bool ended = false;
  // The running stream's context (shared: Cancel may outlive the call it cancels).
  std::shared_ptr<grpc::ClientContext> context;
  Call* call = nullptr;  // the running attempt (alive while set)
  int migrations = 0;
  int64_t resumed_tokens = 0;  // output tokens (all choices) before the running attempt
  v1::ResumeState resume;      // the running attempt's resume point (after a migration)
  // The running (or next) attempt is a drain hand-off: from the worker `handoff_source` that
  // stopped the request's attempt `handoff_request_id` ("host:port" `handoff_endpoint`; empty:
  // no hand-off), to a worker of `handoff_role`.
  std::string handoff_endpoint;
  std::string handoff_source;
  std::string handoff_request_id;
  v1::WorkerRole handoff_role = v1::WORKER_ROLE_UNSPECIFIED;
  v1::WorkerRole role = v1::WORKER_ROLE_UNSPECIFIED;  // the running attempt's worker's

  // What the client received of each choice: the resume point of a migration. Under
  // progress_mu (the running call's thread writes it; the next attempt reads it).
  struct Progress {
    std::vector<uint32_t> tokens;
    std::string tail;  // the stop-string tail the worker held back after them
    bool finished = false;
  };
  std::mutex progress_mu;
  std::vector<Progress> progress;
  bool tracked = true;         // false: over a cap, or inconsistent (cannot migrate)
  int64_t tracked_tokens = 0;  // counted in the dispatcher's total
};

namespace {

// Why a stream that sent tokens may continue elsewhere; "" when it may not (the client left, the
// request is invalid or past its deadline).
std::string MigrationCause(bool down, bool worker_error, grpc::StatusCode code) {
  if (down) return "worker_down";
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::UNKNOWN:
      return worker_error ? "worker_error" : "stream_broken";
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::DATA_LOSS:
      return "worker_error";
    default:
      return "";
  }
}

}  // namespace

// One Generate stream to one worker; on a decode worker also the Prefill call its reservation
// asks for (the P/D path, ARCHITECTURE.md §3): the reservation event starts Prefill on a prefill
// worker, the decode worker then streams. A prefill that fails ends the stream (the decode
// worker frees its reservation) and counts as a failure of the prefill worker, before the first
// token: the request is retried elsewhere. Cancelling the stream cancels the prefill too. A drain
// hand-off (request.handoff_source_endpoint) calls no prefill worker: the target pulls the KV from
// the source; its first token (or its end, OK) completes the hand-off.
// Deletes itself when the stream and the prefill call are both done.
class Dispatcher::Call final {
 public:
  // `pending` and `active`: the load the dispatcher added on `worker` for this stream (released
  // at the first token and at the end).
  Call(Dispatcher* dispatcher, std::shared_ptr<Job> job, v1::GenerateRequest request,
       int64_t resumed_tokens, const Candidate& worker, const std::string& token,
       const RouteChoice& choice, int64_t pending, int64_t active)
      : dispatcher_(dispatcher),
        job_(std::move(job)),
        request_(std::move(request)),
        resumed_tokens_(resumed_tokens),
        worker_(worker.id),
        endpoint_(worker.endpoint),
        disaggregated_(worker.role == v1::WORKER_ROLE_DECODE),
        handoff_(!request_.handoff_source_endpoint().empty()),
        token_(token),
        context_(std::make_shared<grpc::ClientContext>()),
        pending_(pending),
        active_(active),
        predicted_local_(choice.predicted_local_tokens),
        predicted_store_(choice.predicted_store_tokens) {
    context_->set_deadline(absl::ToChronoTime(job_->request.deadline));
    context_->AddMetadata(kTraceIdMetadataKey, job_->request.trace_id);
    AttachSharedToken(context_.get(), token);
    if (disaggregated_) request_.set_aggregated(false);
  }

  const std::shared_ptr<grpc::ClientContext>& context() const { return context_; }

  // The stream: StartCall, then Read after Read until one fails, then Finish, each completing on
  // `completions`' thread.
  void Start(v1::Worker::Stub* stub, CompletionThread* completions) {
    completions_ = completions;
    reader_ = stub->PrepareAsyncGenerate(context_.get(), request_, completions->queue());
    reader_->StartCall(&on_started_);
  }

  // The registry found worker `id` down (under the dispatcher's mu_, so the call is alive): the
  // stream from it ends (and migrates), or the prefill on it is given up before the first token
  // (and retried elsewhere).
  void WorkerDown(const std::string& id) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stream_done_) return;
      if (id == worker_) {
        down_ = true;
      } else if (id == prefill_worker_ && !prefill_done_) {
        prefill_status_ = absl::UnavailableError(absl::StrCat("prefill worker ", id, " went down"));
        prefill_retryable_ = true;
      } else {
        return;
      }
    }
    context_->TryCancel();
  }

 private:
  void OnStarted(bool ok) {
    if (!ok) return reader_->Finish(&status_, &on_finished_);
    reader_->Read(&event_, &on_read_);
  }

  void OnRead(bool ok) {
    if (!ok) return reader_->Finish(&status_, &on_finished_);
    if (event_.has_reservation()) {
      // A hand-off's target pulls the KV itself; an aggregated worker sends a reservation on a
      // hand-off only: neither asks for a prefill.
      if (disaggregated_ && !handoff_) StartPrefill(event_.reservation());
    } else {
      if (event_.has_tokens() && event_.tokens().token_ids_size() > 0 && !started_) {
        started_ = true;
        ReleasePending();  // the prompt is computed
        if (handoff_) HandoffCompleted();
      }
      if (event_.has_usage()) {
        if (dispatcher_->observer_.prefix) {
          const v1::CachedTokens& by = event_.usage().cached_by_source();
          dispatcher_->observer_.prefix(predicted_local_, predicted_store_, by.local(), by.store());
        }
        // Usage counted once: the output before a migration is the client's too; the prompt
        // is billed as the client's (the re-prefill of the output is Ferry's cost).
        v1::Usage* usage = event_.mutable_usage();
        usage->set_completion_tokens(usage->completion_tokens() +
                                     static_cast<uint32_t>(resumed_tokens_));
        usage->set_cached_tokens(std::min(usage->cached_tokens(), usage->prompt_tokens()));
      }
      if (event_.has_tokens()) dispatcher_->Record(*job_, event_.tokens());
      if (event_.has_error()) {
        // Held until the stream ends: not shown when the request goes on elsewhere.
        retryable_ = event_.error().retryable();
        error_event_ = event_;
        has_error_ = true;
      } else {
        job_->sink->OnEvent(event_);
      }
    }
    event_.Clear();
    reader_->Read(&event_, &on_read_);
  }

  void OnFinished(bool) {
    const grpc::Status& status = status_;
    absl::Status s = status.ok() ? absl::OkStatus()
                                 : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                                status.error_message());
    bool retryable =
        !status.ok() && (retryable_ || status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
    std::string failed = worker_;
    std::shared_ptr<grpc::ClientContext> prefill;
    bool down = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_done_ = true;
      down = down_;
      if (!prefill_status_.ok() && !started_) {
        // The prefill failed (and ended the stream): the prefill worker is the one to avoid.
        s = prefill_status_;
        retryable = prefill_retryable_;
        failed = prefill_worker_;
      }
      prefill = prefill_context_;
    }
    if (prefill != nullptr) prefill->TryCancel();  // the stream ended: so does the prefill
    ReleasePending();
    if (active_ > 0) dispatcher_->registry_->AddLoad(worker_, 0, 0, -active_);
    if (down) {
      s = absl::UnavailableError(
          absl::StrCat("worker ", worker_,
                       " went down during the stream (its status stream broke or fell silent)"));
      retryable = true;
    }
    if (handoff_ && !started_ && s.ok()) HandoffCompleted();  // ended without a new token
    const std::string cause =
        s.ok() ? "" : MigrationCause(down, has_error_, static_cast<grpc::StatusCode>(s.code()));
    dispatcher_->CallEnded(job_, worker_, failed, s, started_, !s.ok() && retryable, cause,
                           has_error_ ? &error_event_ : nullptr);
    Unref();
  }

  void HandoffCompleted() {
    LOG(INFO) << LogTraceId(job_->request.trace_id) << "request " << job_->request.trace_id << " ("
              << request_.request().context().request_id() << "): drain hand-off from "
              << request_.handoff_source_endpoint() << " to " << worker_ << " completed";
    if (dispatcher_->observer_.handoff) dispatcher_->observer_.handoff("completed");
  }

  void ReleasePending() {
    if (pending_ > 0) dispatcher_->registry_->AddLoad(worker_, 0, -pending_);
    pending_ = 0;
  }

  void StartPrefill(const v1::KvReservation& reservation) {
    auto picked = dispatcher_->PickPrefill(job_);
    if (!picked.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        prefill_status_ = picked.status();
        prefill_retryable_ = true;
      }
      context_->TryCancel();
      return;
    }
    const Candidate* chosen = &picked->first;
    const RouteChoice& choice = picked->second;
    // The prefill worker computes the prompt: the prediction is about it.
    predicted_local_ = choice.predicted_local_tokens;
    predicted_store_ = choice.predicted_store_tokens;
    auto* rpc = new PrefillRpc(this, chosen->id, job_->Uncached(choice));
    rpc->context = std::make_shared<grpc::ClientContext>();
    rpc->context->set_deadline(absl::ToChronoTime(job_->request.deadline));
    rpc->context->AddMetadata(kTraceIdMetadataKey, job_->request.trace_id);
    AttachSharedToken(rpc->context.get(), token_);
    *rpc->request.mutable_request() = request_.request();
    *rpc->request.mutable_destination() = reservation;
    rpc->request.set_decode_endpoint(endpoint_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefill_worker_ = chosen->id;
      prefill_context_ = rpc->context;
      if (stream_done_) {  // (cancelled meanwhile)
        delete rpc;
        return;
      }
      refs_.fetch_add(1);
    }
    dispatcher_->registry_->AddLoad(chosen->id, +1, rpc->pending);
    dispatcher_->Routed(chosen->id);
    rpc->reader =
        chosen->stub->PrepareAsyncPrefill(rpc->context.get(), rpc->request, completions_->queue());
    rpc->reader->StartCall();
    rpc->reader->Finish(&rpc->response, &rpc->status, rpc);
  }

  void OnPrefillDone(const std::string& prefill_id, int64_t pending, const grpc::Status& status) {
    dispatcher_->registry_->AddLoad(prefill_id, -1, -pending);
    {
      std::lock_guard<std::mutex> lock(mu_);
      prefill_done_ = true;
    }
    if (!status.ok()) {
      bool end_stream = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!stream_done_) {
          prefill_status_ = absl::Status(
              static_cast<absl::StatusCode>(status.error_code()),
              absl::StrCat("prefill worker ", prefill_id, ": ", status.error_message()));
          prefill_retryable_ = status.error_code() != grpc::StatusCode::INVALID_ARGUMENT &&
                               status.error_code() != grpc::StatusCode::CANCELLED;
          end_stream = true;
        }
      }
      if (end_stream) context_->TryCancel();
    }
    Unref();
  }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // The Prefill call the reservation asked for; deletes itself when it completed.
  struct PrefillRpc final : CompletionThread::Tag {
    PrefillRpc(Call* call, std::string worker, int64_t pending)
        : call(call), worker(std::move(worker)), pending(pending) {}
    void OnComplete(bool) override {
      call->OnPrefillDone(worker, pending, status);
      delete this;
    }

    Call* const call;
    const std::string worker;
    const int64_t pending;  // prompt tokens it computes (the load added on it)
    std::shared_ptr<grpc::ClientContext> context;
    v1::PrefillRequest request;
    v1::PrefillResponse response;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::PrefillResponse>> reader;
    grpc::Status status;
  };

  Dispatcher* const dispatcher_;
  const std::shared_ptr<Job> job_;
  v1::GenerateRequest request_;   // this attempt's (disaggregated: without `aggregated`)
  const int64_t resumed_tokens_;  // output tokens the attempt continues from (all choices)
  const std::string worker_;
  const std::string endpoint_;
  const bool disaggregated_;
  const bool handoff_;  // a drain hand-off: the target pulls the KV from the source
  const std::string token_;
  const std::shared_ptr<grpc::ClientContext> context_;
  CompletionThread* completions_ = nullptr;
  std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateEvent>> reader_;
  MethodTag<Call> on_started_{this, &Call::OnStarted};
  MethodTag<Call> on_read_{this, &Call::OnRead};
  MethodTag<Call> on_finished_{this, &Call::OnFinished};
  grpc::Status status_;
  v1::GenerateEvent event_;
  bool started_ = false;  // a token arrived
  bool retryable_ = false;
  bool has_error_ = false;
  v1::GenerateEvent error_event_;
  std::atomic<int> refs_{1};  // the stream's; +1 while the prefill call runs
  std::mutex mu_;
  bool stream_done_ = false;
  bool down_ = false;  // the registry found worker_ down
  bool prefill_done_ = false;
  std::string prefill_worker_;
  std::shared_ptr<grpc::ClientContext> prefill_context_;
  absl::Status prefill_status_;
  bool prefill_retryable_ = false;
  // Completion-thread state (the stream's and the prefill's callbacks run there, one at a time).
  int64_t pending_ = 0;  // prompt tokens added on worker_ until the first token
  const int64_t active_ = 0;
  int64_t predicted_local_ = 0, predicted_store_ = 0;
};

Dispatcher::Dispatcher(WorkerRegistry* registry, RoutingPolicy* policy, DispatcherOptions options,
                       DispatchObserver observer)
    : registry_(registry),
      policy_(policy),
      options_(std::move(options)),
      observer_(std::move(observer)) {
  completions_ = options_.completions;
  if (completions_.empty()) {
    own_completions_ = std::make_unique<CompletionThread>("dispatch");
    completions_.push_back(own_completions_.get());
  }
  timer_ = std::thread([this] { TimerLoop(); });
}

Dispatcher::~Dispatcher() {
  DropQueue(absl::UnavailableError("the router is shutting down"));
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  idle_cv_.wait_for(lock, std::chrono::seconds(30), [&] { return running_ == 0; });
  lock.unlock();
  timer_.join();
}

absl::StatusOr<std::shared_ptr<Dispatcher::Job>> Dispatcher::Dispatch(
    DispatchRequest request, std::shared_ptr<GenerateSink> sink) {
  if (!registry_->AnyUp())
    return absl::UnavailableError("no worker can take requests: none is up, or all are draining");
  auto job = std::make_shared<Job>(std::move(request), std::move(sink));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::UnavailableError("the router is shutting down");
    // Behind the queue unless it is empty: arrival order.
    if (!queue_.empty()) {
      if (static_cast<int64_t>(queue_.size()) >= options_.max_queued) {
        return absl::ResourceExhaustedError(absl::StrCat("every worker is busy and ", queue_.size(),
                                                         " requests are waiting; retry later"));
      }
      job->queued = true;
      queue_.push_back(job);
      if (observer_.queue_depth) observer_.queue_depth(static_cast<int64_t>(queue_.size()));
      return job;
    }
  }
  if (TryStart(job)) return job;
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(queue_.size()) >= options_.max_queued) {
    return absl::ResourceExhaustedError("every worker is busy and the queue is full; retry later");
  }
  job->queued = true;
  queue_.push_back(job);
  if (observer_.queue_depth) observer_.queue_depth(static_cast<int64_t>(queue_.size()));
  cv_.notify_all();
  return job;
}

std::vector<Candidate> Dispatcher::CandidatesFor(const std::shared_ptr<Job>& job,
                                                 v1::WorkerRole role) {
  std::vector<Candidate> candidates = registry_->Candidates();
  auto of_role = [role](const Candidate& c) {
    return role == v1::WORKER_ROLE_UNSPECIFIED ||
           (role == v1::WORKER_ROLE_PREFILL) == (c.role == v1::WORKER_ROLE_PREFILL);
  };
  std::lock_guard<std::mutex> lock(mu_);
  const bool others = std::any_of(candidates.begin(), candidates.end(), [&](const Candidate& c) {
    return of_role(c) && job->excluded.count(c.id) == 0;
  });
  // The workers that failed the job are avoided while another can take it; with none left
  // (a small pool, a worker restarted on its address) they get it again.
  if (others) {
    candidates.erase(
        std::remove_if(candidates.begin(), candidates.end(),
                       [&](const Candidate& c) { return job->excluded.count(c.id) > 0; }),
        candidates.end());
  }
  return candidates;
}

std::vector<Candidate> Dispatcher::HandoffTargets(const std::shared_ptr<Job>& job) {
  std::vector<Candidate> candidates = registry_->Candidates();
  std::lock_guard<std::mutex> lock(mu_);
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [&](const Candidate& c) {
                                    return c.role != job->handoff_role ||
                                           c.id == job->handoff_source ||
                                           c.endpoint == job->handoff_endpoint ||
                                           job->excluded.count(c.id) > 0;
                                  }),
                   candidates.end());
  return candidates;
}

RouteChoice Dispatcher::Choose(const std::vector<Candidate>& candidates,
                               const std::shared_ptr<Job>& job) {
  std::vector<WorkerLoadView> views;
  views.reserve(candidates.size());
  for (const Candidate& c : candidates) views.push_back(c.load);
  const RouteChoice choice = policy_->Choose(views, job->route());
  if (observer_.decided) observer_.decided(policy_->name(), choice);
  return choice;
}

absl::StatusOr<std::pair<Candidate, RouteChoice>> Dispatcher::PickPrefill(
    const std::shared_ptr<Job>& job) {
  std::vector<Candidate> candidates = CandidatesFor(job, v1::WORKER_ROLE_PREFILL);
  candidates.erase(
      std::remove_if(candidates.begin(), candidates.end(),
                     [](const Candidate& c) { return c.role != v1::WORKER_ROLE_PREFILL; }),
      candidates.end());
  if (candidates.empty()) {
    return absl::UnavailableError("no prefill worker can take the request now");
  }
  const RouteChoice choice = Choose(candidates, job);
  return std::make_pair(candidates[choice.index], choice);
}

void Dispatcher::Routed(const std::string& worker) {
  if (observer_.routed) observer_.routed(policy_->name(), worker);
}

bool Dispatcher::TryStart(const std::shared_ptr<Job>& job) {
  bool handoff = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job->cancelled || job->ended) return true;  // nothing to start
    handoff = !job->handoff_endpoint.empty();
  }
  std::vector<Candidate> candidates;
  if (handoff) {
    // A drain hand-off: a worker of the source's role (no prefill worker needed).
    candidates = HandoffTargets(job);
    if (candidates.empty()) {
      std::string source;
      {
        std::lock_guard<std::mutex> lock(mu_);
        source = job->handoff_source;
        job->handoff_endpoint.clear();
        job->handoff_source.clear();
        job->handoff_request_id.clear();
      }
      LOG(WARNING) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
                   << ": no worker can take its drain "
                   << "hand-off from " << source << "; resuming it by re-prefill";
      if (observer_.handoff) observer_.handoff("fell_back");
      handoff = false;
    }
  }
  if (!handoff) {
    candidates = CandidatesFor(job, v1::WORKER_ROLE_DECODE);
    // Where the request can stream from: aggregated workers, and decode workers while a prefill
    // worker can take it too.
    const std::vector<Candidate> prefills = CandidatesFor(job, v1::WORKER_ROLE_PREFILL);
    const bool prefill = std::any_of(prefills.begin(), prefills.end(), [](const Candidate& c) {
      return c.role == v1::WORKER_ROLE_PREFILL;
    });
    candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                    [&](const Candidate& c) {
                                      return c.role == v1::WORKER_ROLE_PREFILL ||
                                             (c.role == v1::WORKER_ROLE_DECODE && !prefill);
                                    }),
                     candidates.end());
  }
  if (candidates.empty()) return false;
  const RouteChoice choice = Choose(candidates, job);
  const Candidate& chosen = candidates[choice.index];
  // An aggregated worker computes the prompt (not on a hand-off: its KV is pushed); a decode
  // worker holds it while it decodes.
  const bool decode = chosen.role == v1::WORKER_ROLE_DECODE;
  const int64_t pending = decode || handoff ? 0 : job->Uncached(choice);
  const int64_t active = decode ? job->request.prompt_tokens : 0;
  registry_->AddLoad(chosen.id, +1, pending, active);
  Call* call = nullptr;
  std::string attempt_id, source;
  int64_t carried = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    call = new Call(this, job, job->Attempt(), job->resumed_tokens, chosen, options_.auth_token,
                    choice, pending, active);
    ++running_;
    ++job->attempts;
    job->context = call->context();
    job->call = call;
    job->role = chosen.role;
    streaming_.insert(job);
    attempt_id = job->attempt_id();
    source = job->handoff_source;
    carried = job->resumed_tokens;
  }
  if (handoff) {
    LOG(INFO) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id << " ("
              << attempt_id << "): drain hand-off from " << source << " to " << chosen.id << ", "
              << carried << " output tokens carried";
  }
  if (LogEnabled(LogSeverity::kDebug)) {
    LOG(DEBUG) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id << " ("
               << attempt_id << "): to worker " << chosen.id << " (" << choice.reason << ")";
  }
  if (observer_.routed) observer_.routed(policy_->name(), chosen.id);
  job->sink->OnRouted(chosen.id);
  call->Start(chosen.stub.get(), completions_[next_completion_.fetch_add(1) % completions_.size()]);
  return true;
}

void Dispatcher::CallEnded(const std::shared_ptr<Job>& job, const std::string& worker,
                           const std::string& failed, const absl::Status& status, bool started,
                           bool retryable, const std::string& migrate_cause,
                           const v1::GenerateEvent* error) {
  registry_->AddLoad(worker, -1);
  bool retry = false, migrate = false;
  absl::Status end = status;
  std::string failure;  // why the request failed, for the metric
  int64_t carried = 0;
  std::string cause = migrate_cause;
  std::string handoff_source;   // the source of this attempt, a drain hand-off
  std::string handoff_outcome;  // of this attempt, a hand-off that ended before a new token
  {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    job->context.reset();
    job->call = nullptr;
    streaming_.erase(job);
    // This attempt was a drain hand-off: one that failed before a new token falls back to a
    // re-prefill (under the next attempt id: the target may still hold this one).
    const bool handoff_attempt = !job->handoff_endpoint.empty();
    handoff_source = job->handoff_source;
    job->handoff_endpoint.clear();
    job->handoff_source.clear();
    job->handoff_request_id.clear();
    const bool failed_handoff = handoff_attempt && !started && !status.ok();
    if (failed_handoff) cause = "handoff_failed";
    // The worker stopped the request draining, with its KV kept for a hand-off.
    const std::string handoff_endpoint = error != nullptr && !status.ok() && !failed_handoff
                                             ? error->error().handoff_endpoint()
                                             : std::string();
    const bool before_deadline = absl::Now() < job->request.deadline;
    // A stream that sent tokens (in this attempt or an earlier one) and failed: continue it
    // elsewhere from what the client received.
    const bool had_output = started || job->migrations > 0;
    retry = !status.ok() && !started && retryable && !job->cancelled &&
            job->attempts <= options_.max_retries && before_deadline && !failed_handoff &&
            !(had_output && !handoff_endpoint.empty());
    if (retry) job->excluded.insert(failed);
    if (!status.ok() && !retry && had_output && !job->cancelled && !cause.empty()) {
      std::lock_guard<std::mutex> progress(job->progress_mu);
      const int32_t n = std::max<int32_t>(1, job->request.request.request().sampling().n());
      bool finished = static_cast<int32_t>(job->progress.size()) == n;
      for (const Job::Progress& p : job->progress) finished = finished && p.finished;
      if (finished) {
        // Every choice had ended; only the usage was lost: done.
        end = absl::OkStatus();
        error = nullptr;
      } else if (!job->tracked) {
        failure = "untracked";
      } else if (n != 1) {
        failure = "several_choices";
      } else if (job->migrations >= options_.max_migrations) {
        failure = "migration_limit";
      } else if (!before_deadline) {
        failure = "deadline";
      } else {
        migrate = true;
        job->excluded.insert(worker);
        if (orphans_.size() >= 1024 && orphans_.count(worker) == 0) {
          orphans_.erase(orphans_.begin());  // workers gone for good (addresses of the past)
        }
        const std::string stopped_attempt = job->attempt_id();
        std::deque<std::string>& orphans = orphans_[worker];
        orphans.push_back(stopped_attempt);
        while (static_cast<int64_t>(orphans.size()) > options_.max_orphans_per_worker) {
          orphans.pop_front();
        }
        ++job->migrations;
        job->resume.Clear();
        const uint64_t seed = job->request.request.request().sampling().seed();
        carried = 0;
        for (size_t c = 0; c < job->progress.size(); ++c) {
          const Job::Progress& p = job->progress[c];
          v1::ResumedChoice* choice = job->resume.add_choices();
          choice->mutable_generated_token_ids()->Add(p.tokens.begin(), p.tokens.end());
          v1::SamplerState* state = choice->mutable_sampler_state();
          state->set_seed(seed);
          state->set_choice_index(static_cast<uint32_t>(c));
          state->set_output_count(static_cast<uint32_t>(p.tokens.size()));
          std::map<uint32_t, uint32_t> counts;
          for (uint32_t t : p.tokens) ++counts[t];
          for (const auto& [token, count] : counts) {
            v1::TokenCount* tc = state->add_penalty_counts();
            tc->set_token_id(token);
            tc->set_count(count);
          }
          state->set_stop_string_tail(p.tail);
          carried += static_cast<int64_t>(p.tokens.size());
        }
        if (job->resume.choices_size() == 0) {
          // No chunk was recorded (a token-less stream): start the one choice afresh.
          v1::ResumedChoice* choice = job->resume.add_choices();
          choice->mutable_sampler_state()->set_seed(seed);
        }
        job->resumed_tokens = carried;
        // A hand-off continues from the last token's KV: there must be one.
        if (!handoff_endpoint.empty() && carried > 0) {
          cause = "drain_handoff";
          job->handoff_endpoint = handoff_endpoint;
          job->handoff_source = worker;
          job->handoff_request_id = stopped_attempt;
          job->handoff_role = job->role;
        }
      }
    } else if (!status.ok() && !retry && !job->cancelled) {
      switch (status.code()) {
        case absl::StatusCode::kDeadlineExceeded:
          failure = "deadline";
          break;
        case absl::StatusCode::kUnavailable:
        case absl::StatusCode::kResourceExhausted:
          failure = "no_worker";
          break;
        case absl::StatusCode::kInternal:
        case absl::StatusCode::kUnknown:
        case absl::StatusCode::kAborted:
        case absl::StatusCode::kDataLoss:
          failure = "worker_error";
          break;
        default:  // the request's own fault (invalid, too long): not a failure of the service
          break;
      }
    }
    if (!failure.empty() && had_output) {
      end = absl::Status(status.code(),
                         absl::StrCat(status.message(),
                                      "; the request cannot continue on "
                                      "another worker (",
                                      failure == "untracked"         ? "its output is not tracked"
                                      : failure == "several_choices" ? "it has several choices"
                                      : failure == "migration_limit"
                                          ? absl::StrCat("it moved ", job->migrations, " times")
                                          : "its deadline passed",
                                      ")"));
    }
    if (failed_handoff && !job->cancelled) {
      handoff_outcome = migrate ? "fell_back" : end.ok() ? "completed" : "failed";
    }
    if (stopping_ && running_ == 0) idle_cv_.notify_all();  // only the destructor waits here
  }
  if (retry) {
    LOG(INFO) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
              << ": worker " << failed << " failed it before its first token (" << status
              << "); trying another";
    if (observer_.retried) observer_.retried();
  }
  if (!handoff_outcome.empty()) {
    if (handoff_outcome != "completed") {  // (completed: every choice had ended)
      LOG(WARNING) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
                   << ": its drain hand-off from " << handoff_source << " to " << worker
                   << " failed (" << status << "); "
                   << (handoff_outcome == "fell_back" ? "resuming it by re-prefill"
                                                      : "it cannot go on");
    }
    if (observer_.handoff) observer_.handoff(handoff_outcome);
  }
  if (migrate) {
    if (cause == "drain_handoff") {
      LOG(INFO) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
                << ": worker " << worker << " stopped it draining; handing it off with " << carried
                << " output tokens to another worker";
    } else {
      LOG(WARNING) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
                   << ": worker " << worker << " failed it mid-stream (" << cause << ": " << status
                   << "); moving it with " << carried << " output tokens to another worker";
    }
    if (observer_.migrated) observer_.migrated(cause, carried);
    retry = true;
  }
  if (retry && !TryStart(job)) {
    std::lock_guard<std::mutex> lock(mu_);
    if (static_cast<int64_t>(queue_.size()) < options_.max_queued && !stopping_) {
      job->queued = true;
      queue_.push_front(job);  // it already waited its turn
    } else {
      retry = false;
      failure = "no_worker";
    }
  }
  if (!retry) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->ended = true;
    }
    Untrack(*job);
    if (!failure.empty()) {
      if (failure != "no_worker" || !end.ok()) {
        LOG(WARNING) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
                     << " failed (" << failure << "): " << end;
      }
      if (observer_.failed) observer_.failed(failure);
    }
    if (error != nullptr && !end.ok()) job->sink->OnEvent(*error);
    job->sink->OnEnd(end);
  }
  Pump();
}

void Dispatcher::Record(Job& job, const v1::TokenChunk& chunk) {
  bool over = false;
  {
    std::lock_guard<std::mutex> lock(job.progress_mu);
    if (!job.tracked) return;
    const uint32_t c = chunk.choice_index();
    const int64_t n = chunk.token_ids_size();
    bool consistent = c < 4096;
    if (consistent && c >= job.progress.size()) job.progress.resize(c + 1);
    if (consistent) consistent = chunk.first_output_index() == job.progress[c].tokens.size();
    const bool fits = job.tracked_tokens + n <= options_.max_tracked_tokens_per_request &&
                      tracked_tokens_.load() + n <= options_.max_tracked_tokens;
    if (!consistent || !fits) {
      if (!consistent) {
        LOG(WARNING) << LogTraceId(job.request.trace_id) << "request " << job.request.trace_id
                     << ": choice " << c << " continues at output " << chunk.first_output_index()
                     << ", not where the router's record ends: it cannot migrate";
      }
      job.tracked = false;
      tracked_tokens_.fetch_sub(job.tracked_tokens);
      job.tracked_tokens = 0;
      job.progress.clear();
      job.progress.shrink_to_fit();
      over = true;
    } else {
      Job::Progress& p = job.progress[c];
      p.tokens.insert(p.tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
      p.tail = chunk.stop_string_tail();
      if (chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) p.finished = true;
      job.tracked_tokens += n;
      tracked_tokens_.fetch_add(n);
    }
  }
  if (over && observer_.untracked) observer_.untracked();
}

void Dispatcher::Untrack(Job& job) {
  std::lock_guard<std::mutex> lock(job.progress_mu);
  tracked_tokens_.fetch_sub(job.tracked_tokens);
  job.tracked_tokens = 0;
  job.progress.clear();
  job.progress.shrink_to_fit();
}

void Dispatcher::OnWorkerState(const std::string& id, bool up) {
  if (up) {
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Back (restarted, or its stall is over): a new chance for the jobs it failed.
      for (const std::shared_ptr<Job>& job : queue_) job->excluded.erase(id);
      for (const std::shared_ptr<Job>& job : streaming_) job->excluded.erase(id);
      auto it = orphans_.find(id);
      if (it == orphans_.end()) return;
      ids.assign(it->second.begin(), it->second.end());
      orphans_.erase(it);
    }
    return AbortOrphans(id, std::move(ids));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::shared_ptr<Job>& job : streaming_) {
    if (job->call != nullptr) job->call->WorkerDown(id);
  }
}

void Dispatcher::AbortOrphans(const std::string& id, std::vector<std::string> ids) {
  std::shared_ptr<v1::Worker::Stub> stub;
  for (const Candidate& c : registry_->Candidates()) {
    if (c.id == id) stub = c.stub;
  }
  if (stub == nullptr) {
    // Up but not a candidate now (full, draining): keep them for its next return.
    std::lock_guard<std::mutex> lock(mu_);
    std::deque<std::string>& orphans = orphans_[id];
    orphans.insert(orphans.end(), ids.begin(), ids.end());
    return;
  }
  LOG(INFO) << "worker " << id << " is back: aborting " << ids.size()
            << " requests that moved away from it";
  for (const std::string& request_id : ids) {
    struct Rpc {
      grpc::ClientContext context;
      v1::AbortRequest request;
      v1::AbortResponse response;
    };
    auto rpc = std::make_shared<Rpc>();
    rpc->context.set_deadline(absl::ToChronoTime(absl::Now() + options_.abort_timeout));
    AttachSharedToken(&rpc->context, options_.auth_token);
    rpc->request.set_request_id(request_id);
    rpc->request.set_reason("the request moved to another worker while this one was down");
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++running_;  // the destructor waits for it
    }
    stub->async()->Abort(&rpc->context, &rpc->request, &rpc->response,
                         [this, rpc, stub](grpc::Status status) {
                           if (observer_.orphan_abort) {
                             observer_.orphan_abort(!status.ok()            ? "failed"
                                                    : rpc->response.found() ? "found"
                                                                            : "not_found");
                           }
                           std::lock_guard<std::mutex> lock(mu_);
                           --running_;
                           if (stopping_ && running_ == 0) idle_cv_.notify_all();
                         });
  }
}

void Dispatcher::Pump() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
      job->queued = false;
    }
    if (!TryStart(job)) {
      std::lock_guard<std::mutex> lock(mu_);
      job->queued = true;
      queue_.push_front(job);
      if (observer_.queue_depth) observer_.queue_depth(static_cast<int64_t>(queue_.size()));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (observer_.queue_depth) observer_.queue_depth(static_cast<int64_t>(queue_.size()));
  }
}

void Dispatcher::Cancel(const std::shared_ptr<Job>& job) {
  std::shared_ptr<grpc::ClientContext> context;
  bool was_queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job->cancelled || job->ended) return;
    job->cancelled = true;
    if (job->queued) {
      queue_.erase(std::remove(queue_.begin(), queue_.end(), job), queue_.end());
      job->queued = false;
      job->ended = true;
      was_queued = true;
    }
    context = job->context;
  }
  if (context != nullptr) context->TryCancel();  // the stream ends CANCELLED; CallEnded follows
  if (was_queued) {
    Untrack(*job);
    job->sink->OnEnd(absl::CancelledError("the client went away"));
  }
}

void Dispatcher::DropQueue(const absl::Status& why) {
  std::deque<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(queue_);
    for (auto& job : dropped) {
      job->queued = false;
      job->ended = true;
    }
  }
  for (auto& job : dropped) {
    Untrack(*job);
    job->sink->OnEnd(why);
  }
}

void Dispatcher::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    // Queued requests past their deadline; and, with no worker up at all, every queued one.
    const absl::Time now = absl::Now();
    const bool any_up = registry_->AnyUp();
    std::vector<std::pair<std::shared_ptr<Job>, absl::Status>> ended;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (now >= (*it)->request.deadline || !any_up) {
        (*it)->queued = false;
        (*it)->ended = true;
        ended.emplace_back(
            *it,
            now >= (*it)->request.deadline
                ? absl::DeadlineExceededError("the request waited for a worker until its deadline")
                : absl::UnavailableError(
                      "no worker can take requests: none is up, or all are draining"));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    const bool pump = !queue_.empty();
    lock.unlock();
    for (auto& [job, status] : ended) {
      Untrack(*job);
      if (observer_.failed) {
        observer_.failed(status.code() == absl::StatusCode::kDeadlineExceeded ? "deadline"
                                                                              : "no_worker");
      }
      job->sink->OnEnd(status);
    }
    if (pump) Pump();  // in case a worker freed up without a registry change
    lock.lock();
  }
}

int64_t Dispatcher::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t Dispatcher::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

}  // namespace ferry
