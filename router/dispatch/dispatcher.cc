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
    r.prompt_tokens = request.prompt_tokens;
    r.block_hashes = request.block_hashes;
    r.block_tokens = request.request.request().block_tokens();
    r.store_prefix_blocks = request.store_prefix_blocks;
    return r;
  }
  // The prompt tokens a worker must compute, as the policy expects it.
  int64_t Uncached(const RouteChoice& choice) const {
    return std::max<int64_t>(
        0, request.prompt_tokens - choice.predicted_local_tokens - choice.predicted_store_tokens);
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
};

// One Generate stream to one worker; on a decode worker also the Prefill call its reservation
// asks for (the P/D path, ARCHITECTURE.md §3): the reservation event starts Prefill on a prefill
// worker, the decode worker then streams. A prefill that fails ends the stream (the decode
// worker frees its reservation) and counts as a failure of the prefill worker, before the first
// token: the request is retried elsewhere. Cancelling the stream cancels the prefill too.
// Deletes itself when the stream and the prefill call are both done.
class Dispatcher::Call final {
 public:
  // `pending` and `active`: the load the dispatcher added on `worker` for this stream (released
  // at the first token and at the end).
  Call(Dispatcher* dispatcher, std::shared_ptr<Job> job, const Candidate& worker,
       const std::string& token, const RouteChoice& choice, int64_t pending, int64_t active)
      : dispatcher_(dispatcher),
        job_(std::move(job)),
        worker_(worker.id),
        endpoint_(worker.endpoint),
        disaggregated_(worker.role == v1::WORKER_ROLE_DECODE),
        token_(token),
        context_(std::make_shared<grpc::ClientContext>()),
        pending_(pending),
        active_(active),
        predicted_local_(choice.predicted_local_tokens),
        predicted_store_(choice.predicted_store_tokens) {
    context_->set_deadline(absl::ToChronoTime(job_->request.deadline));
    context_->AddMetadata(kTraceIdMetadataKey, job_->request.trace_id);
    AttachSharedToken(context_.get(), token);
    if (disaggregated_) {
      request_ = job_->request.request;
      request_.set_aggregated(false);
    }
  }

  const std::shared_ptr<grpc::ClientContext>& context() const { return context_; }

  // The stream: StartCall, then Read after Read until one fails, then Finish, each completing on
  // `completions`' thread.
  void Start(v1::Worker::Stub* stub, CompletionThread* completions) {
    completions_ = completions;
    reader_ = stub->PrepareAsyncGenerate(
        context_.get(), disaggregated_ ? request_ : job_->request.request, completions->queue());
    reader_->StartCall(&on_started_);
  }

 private:
  void OnStarted(bool ok) {
    if (!ok) return reader_->Finish(&status_, &on_finished_);
    reader_->Read(&event_, &on_read_);
  }

  void OnRead(bool ok) {
    if (!ok) return reader_->Finish(&status_, &on_finished_);
    if (event_.has_reservation()) {
      StartPrefill(event_.reservation());
    } else {
      if (event_.has_tokens() && event_.tokens().token_ids_size() > 0 && !started_) {
        started_ = true;
        ReleasePending();  // the prompt is computed
      }
      if (event_.has_usage() && dispatcher_->observer_.prefix) {
        const v1::CachedTokens& by = event_.usage().cached_by_source();
        dispatcher_->observer_.prefix(predicted_local_, predicted_store_, by.local(), by.store());
      }
      if (event_.has_error()) {
        retryable_ = event_.error().retryable();
        error_ = event_.error();
        has_error_ = true;
      }
      // An error before the first token is not shown when the request will go elsewhere.
      if (!(event_.has_error() && !started_ && retryable_)) job_->sink->OnEvent(event_);
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      stream_done_ = true;
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
    dispatcher_->CallEnded(job_, worker_, failed, s, started_, !s.ok() && retryable);
    Unref();
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
    *rpc->request.mutable_request() = job_->request.request.request();
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
  const std::string worker_;
  const std::string endpoint_;
  const bool disaggregated_;
  const std::string token_;
  const std::shared_ptr<grpc::ClientContext> context_;
  v1::GenerateRequest request_;  // disaggregated: the job's, without `aggregated`
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
  v1::ErrorInfo error_;
  std::atomic<int> refs_{1};  // the stream's; +1 while the prefill call runs
  std::mutex mu_;
  bool stream_done_ = false;
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

std::vector<Candidate> Dispatcher::CandidatesFor(const std::shared_ptr<Job>& job) {
  std::vector<Candidate> candidates = registry_->Candidates();
  std::lock_guard<std::mutex> lock(mu_);
  candidates.erase(
      std::remove_if(candidates.begin(), candidates.end(),
                     [&](const Candidate& c) { return job->excluded.count(c.id) > 0; }),
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
  std::vector<Candidate> candidates = CandidatesFor(job);
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job->cancelled || job->ended) return true;  // nothing to start
  }
  std::vector<Candidate> candidates = CandidatesFor(job);
  // Where the request can stream from: aggregated workers, and decode workers while a prefill
  // worker can take it too.
  const bool prefill = std::any_of(candidates.begin(), candidates.end(), [](const Candidate& c) {
    return c.role == v1::WORKER_ROLE_PREFILL;
  });
  candidates.erase(std::remove_if(candidates.begin(), candidates.end(),
                                  [&](const Candidate& c) {
                                    return c.role == v1::WORKER_ROLE_PREFILL ||
                                           (c.role == v1::WORKER_ROLE_DECODE && !prefill);
                                  }),
                   candidates.end());
  if (candidates.empty()) return false;
  const RouteChoice choice = Choose(candidates, job);
  const Candidate& chosen = candidates[choice.index];
  // An aggregated worker computes the prompt; a decode worker holds it while it decodes.
  const bool decode = chosen.role == v1::WORKER_ROLE_DECODE;
  const int64_t pending = decode ? 0 : job->Uncached(choice);
  const int64_t active = decode ? job->request.prompt_tokens : 0;
  registry_->AddLoad(chosen.id, +1, pending, active);
  auto* call = new Call(this, job, chosen, options_.auth_token, choice, pending, active);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++running_;
    ++job->attempts;
    job->context = call->context();
  }
  if (observer_.routed) observer_.routed(policy_->name(), chosen.id);
  job->sink->OnRouted(chosen.id);
  call->Start(chosen.stub.get(), completions_[next_completion_.fetch_add(1) % completions_.size()]);
  return true;
}

void Dispatcher::CallEnded(const std::shared_ptr<Job>& job, const std::string& worker,
                           const std::string& failed, const absl::Status& status, bool started,
                           bool retryable) {
  registry_->AddLoad(worker, -1);
  bool retry = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    job->context.reset();
    retry = !status.ok() && !started && retryable && !job->cancelled &&
            job->attempts <= options_.max_retries && absl::Now() < job->request.deadline;
    if (retry) job->excluded.insert(failed);
    if (stopping_ && running_ == 0) idle_cv_.notify_all();  // only the destructor waits here
  }
  if (retry) {
    LOG(INFO) << "request " << job->request.trace_id << ": worker " << failed
              << " failed it before its first token (" << status << "); trying another";
    if (observer_.retried) observer_.retried();
    if (!TryStart(job)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<int64_t>(queue_.size()) < options_.max_queued && !stopping_) {
        job->queued = true;
        queue_.push_front(job);  // it already waited its turn
        retry = true;
      } else {
        retry = false;
      }
    }
  }
  if (!retry) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job->ended = true;
    }
    job->sink->OnEnd(status);
  }
  Pump();
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
  if (was_queued) job->sink->OnEnd(absl::CancelledError("the client went away"));
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
  for (auto& job : dropped) job->sink->OnEnd(why);
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
    for (auto& [job, status] : ended) job->sink->OnEnd(status);
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
