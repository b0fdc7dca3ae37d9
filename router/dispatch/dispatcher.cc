#include "router/dispatch/dispatcher.h"

#include <algorithm>
#include <atomic>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/clock.h"
#include "engine/common/log.h"
#include "services/common/grpc_client.h"
#include "services/common/shared_token.h"

namespace ferry {

class Dispatcher::Job {
 public:
  Job(DispatchRequest request, std::shared_ptr<GenerateSink> sink)
      : request(std::move(request)), sink(std::move(sink)) {
    const v1::TokenizedRequest& r = this->request.request.request();
    record.request_id = r.context().request_id();
    record.deadline = this->request.deadline;
    record.prompt_tokens = this->request.prompt_tokens;
    record.choices = std::max<int32_t>(1, r.sampling().n());
    record.block_hashes = std::move(this->request.block_hashes);
    record.block_tokens = r.block_tokens();
    record.store_prefix_blocks = this->request.store_prefix_blocks;
  }

  // The request the running attempt sends (once started: record.attempts counts it): the
  // client's under the attempt's own id, after a migration with the resume point (and the source
  // of a drain hand-off). A retry or migration sends the images the first attempt sent by encoder
  // handle or not at all (expect_cached) inline instead (`inlined` counts them): the failure may
  // have been the encoder's, or the prediction's.
  // Under the dispatcher's mu_.
  v1::GenerateRequest Attempt(int64_t* inlined) const {
    v1::GenerateRequest r = request.request;
    *inlined = 0;
    if (record.attempts > 1) {
      auto* images = r.mutable_request()->mutable_images();
      for (int i = 0; i < images->size() && i < static_cast<int>(request.inline_images.size());
           ++i) {
        v1::PromptImage& image = (*images)[i];
        if ((image.embeddings_handle().empty() && !image.expect_cached()) ||
            request.inline_images[i].empty()) {
          continue;
        }
        image.clear_embeddings_handle();
        image.clear_encoder_endpoint();
        image.clear_expect_cached();
        image.set_image_data(request.inline_images[i]);
        ++*inlined;
      }
    }
    r.clear_handoff_source_endpoint();
    r.clear_handoff_source_request_id();
    r.mutable_request()->mutable_context()->set_request_id(record.AttemptId());
    if (record.migrations == 0) return r;
    *r.mutable_request()->mutable_resume() = resume;
    // The store probe was of the first attempt's time: the failed attempt may have written
    // blocks since, so the worker asks the store itself.
    r.mutable_request()->clear_store_hint();
    if (record.handoff.active()) {
      r.set_handoff_source_endpoint(record.handoff.endpoint);
      r.set_handoff_source_request_id(record.handoff.request_id);
    }
    return r;
  }

  DispatchRequest request;  // its block_hashes moved to the record
  const std::shared_ptr<GenerateSink> sink;
  // The rules' record (dispatch_rules.h): under the dispatcher's mu_, but for its output
  // (progress, tracked, tracked_tokens), under progress_mu (the running call's thread writes it;
  // the next attempt reads it).
  JobRecord record;
  absl::Mutex progress_mu;
  // Under the dispatcher's mu_: the running stream's context (shared: Cancel may outlive the
  // call it cancels), the running attempt (alive while set), and the running attempt's resume
  // point (after a migration).
  std::shared_ptr<grpc::ClientContext> context;
  Call* call = nullptr;
  v1::ResumeState resume;
};

namespace {

WorkerKind KindOf(v1::WorkerRole role) {
  switch (role) {
    case v1::WORKER_ROLE_PREFILL:
      return WorkerKind::kPrefill;
    case v1::WORKER_ROLE_DECODE:
      return WorkerKind::kDecode;
    default:
      return WorkerKind::kAggregated;
  }
}

// The resume point of the next attempt: each choice's output so far and its sampler's state
// (position-keyed draws, penalty counts, the stop-string tail).
v1::ResumeState ResumeFrom(const JobRecord& record, uint64_t seed) {
  v1::ResumeState resume;
  for (size_t c = 0; c < record.progress.size(); ++c) {
    const ChoiceProgress& p = record.progress[c];
    v1::ResumedChoice* choice = resume.add_choices();
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
  }
  if (resume.choices_size() == 0) {
    // No chunk was recorded (a token-less stream): start the one choice afresh.
    resume.add_choices()->mutable_sampler_state()->set_seed(seed);
  }
  return resume;
}

}  // namespace

// One Generate stream to one worker; on a decode worker also the Prefill call its reservation
// asks for (the P/D path, ARCHITECTURE.md §3): the reservation event starts Prefill on a prefill
// worker, the decode worker then streams. A prefill that fails ends the stream (the decode
// worker frees its reservation) and counts as a failure of the prefill worker, before the first
// token: the request is retried elsewhere. Cancelling the stream cancels the prefill too. A drain
// hand-off (request.handoff_source_endpoint) calls no prefill worker: the target pulls the KV from
// the source; its first token (or its end, OK) completes the hand-off.
// With the worker's token stream open (token_stream_hub.h), the attempt names it: its chunks come
// through the hub (OnChunks, on the stream's thread), the reservation and last event on the call
// (on the call's thread); deliver_mu_ keeps the sink's calls one at a time and in order. A last
// event (Usage or ErrorInfo) that counts more chunks than arrived waits for them, and so does the
// call's end; the stream ending first ends the attempt as a broken stream (it migrates).
// Deletes itself when the stream and the prefill call are both done.
class Dispatcher::Call final : public TokenStreamListener {
 public:
  // `pending` and `active`: the load the dispatcher added on `worker` for this stream (released
  // at the first token and at the end).
  Call(Dispatcher* dispatcher, std::shared_ptr<Job> job, v1::GenerateRequest request,
       int64_t resumed_tokens, const Candidate& worker, const SharedToken& token,
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
  void Start(const std::shared_ptr<v1::Worker::Stub>& stub, CompletionThread* completions) {
    completions_ = completions;
    if (std::optional<TokenStreamRoute> route =
            dispatcher_->token_streams_->Attach(worker_, stub, this)) {
      route_ = *std::move(route);
      multiplexed_ = true;
      request_.set_token_stream_id(route_.stream_id);
      request_.set_token_stream_tag(route_.tag);
    }
    reader_ = stub->PrepareAsyncGenerate(context_.get(), request_, completions->queue());
    reader_->StartCall(&on_started_);
  }

  // TokenStreamListener: this attempt's chunks of one token-stream message.
  void OnChunks(v1::TaggedChunks& entry) override {
    bool end = false;
    {
      absl::MutexLock lock(&deliver_mu_);
      if (end_claimed_) return;
      for (v1::TokenChunk& chunk : *entry.mutable_chunks()) {
        mux_event_.mutable_tokens()->Swap(&chunk);
        HandleEvent(mux_event_);
        ++mux_chunks_;
      }
      if (has_held_last_ && mux_chunks_ >= held_last_.multiplexed_chunks()) {
        has_held_last_ = false;
        HandleEvent(held_last_);
        end = end_claimed_ = rpc_done_;  // the call ended already: so does the attempt
      }
      job_->sink->OnBatchEnd();
    }
    if (end) EndAttempt();
  }

  // TokenStreamListener: the stream ended with this attempt on it; its chunks since are lost.
  void OnStreamLost(const std::string& why) override {
    bool end = false;
    {
      absl::MutexLock lock(&deliver_mu_);
      detached_ = true;
      if (end_claimed_ || last_delivered_) return;
      mux_lost_ = why;
      end = end_claimed_ = rpc_done_;
    }
    if (end) return EndAttempt();
    context_->TryCancel();  // the call ends too, as a broken stream
  }

  void Ref() override { refs_.fetch_add(1); }

  // The registry found worker `id` down (under the dispatcher's mu_, so the call is alive): the
  // stream from it ends (and migrates), or the prefill on it is given up before the first token
  // (and retried elsewhere).
  void WorkerDown(const std::string& id) {
    {
      absl::MutexLock lock(&mu_);
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
    } else if (event_.has_handoff_planned()) {
      // The worker drains and will hand this request off: its target pre-copies the KV now.
      if (dispatcher_->options_.handoff_precopy) {
        dispatcher_->PlanHandoff(job_, worker_, endpoint_,
                                 request_.request().context().request_id(),
                                 absl::FromUnixMillis(event_.handoff_planned().deadline_unix_ms()));
      }
    } else {
      absl::MutexLock lock(&deliver_mu_);
      if (event_.multiplexed_chunks() > mux_chunks_) {
        // Its chunks are still on the token stream; with the stream lost they never come, and
        // the attempt ends as a broken stream without it.
        if (!mux_lost_.has_value()) {
          held_last_.Swap(&event_);
          has_held_last_ = true;
        }
      } else {
        HandleEvent(event_);
        job_->sink->OnBatchEnd();
      }
    }
    event_.Clear();
    reader_->Read(&event_, &on_read_);
  }

  // An event for the sink (a chunk, Usage, ErrorInfo), from the call or the token stream. Under
  // deliver_mu_.
  void HandleEvent(v1::GenerateEvent& event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(deliver_mu_) {
    if (event.has_tokens() && event.tokens().token_ids_size() > 0 && !started_) {
      started_ = true;
      ReleasePending();  // the prompt is computed
      if (handoff_) HandoffCompleted();
    }
    if (event.has_usage()) {
      if (dispatcher_->observer_.prefix) {
        const v1::CachedTokens& by = event.usage().cached_by_source();
        dispatcher_->observer_.prefix(predicted_local_, predicted_store_, by.local(), by.store());
      }
      // Usage counted once: the output before a migration is the client's too; the prompt
      // is billed as the client's (the re-prefill of the output is Ferry's cost).
      v1::Usage* usage = event.mutable_usage();
      usage->set_completion_tokens(usage->completion_tokens() +
                                   static_cast<uint32_t>(resumed_tokens_));
      usage->set_cached_tokens(std::min(usage->cached_tokens(), usage->prompt_tokens()));
    }
    if (event.has_tokens()) dispatcher_->Record(*job_, event.tokens());
    if (event.has_error()) {
      // Held until the stream ends: not shown when the request goes on elsewhere.
      retryable_ = event.error().retryable();
      error_event_ = event;
      has_error_ = true;
    } else {
      job_->sink->OnEvent(event);
    }
    if (event.has_usage() || event.has_error()) last_delivered_ = true;
  }

  void OnFinished(bool) {
    {
      absl::MutexLock lock(&deliver_mu_);
      rpc_done_ = true;
      // The last event waits for its chunks: the attempt ends with them, or when the stream ends.
      if (has_held_last_ && !mux_lost_.has_value()) return;
      if (end_claimed_) return;
      end_claimed_ = true;
    }
    EndAttempt();
  }

  // The attempt is over (once: end_claimed_ was set, so no event arrives any more).
  void EndAttempt() {
    bool detach = false;
    std::optional<std::string> mux_lost;
    {
      absl::MutexLock lock(&deliver_mu_);
      detach = multiplexed_ && !detached_;
      detached_ = true;
      mux_lost = mux_lost_;
    }
    if (detach) dispatcher_->token_streams_->Detach(worker_, route_);
    const grpc::Status& status = status_;
    absl::Status s = status.ok() ? absl::OkStatus()
                                 : absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                                status.error_message());
    bool retryable = !status.ok() && (retryable_ || RetryableCode(s.code()));
    std::string failed = worker_;
    std::shared_ptr<grpc::ClientContext> prefill;
    std::string prefill_worker;
    bool down = false;
    {
      absl::MutexLock lock(&mu_);
      stream_done_ = true;
      down = down_;
      prefill_worker = prefill_worker_;
      if (!prefill_status_.ok() && !started_) {
        // The prefill failed (and ended the stream): the prefill worker is the one to avoid.
        s = prefill_status_;
        retryable = prefill_retryable_;
        failed = prefill_worker_;
      }
      prefill = prefill_context_;
    }
    // A stream that failed ends its prefill too; one that completed had all of its KV, and the
    // prefill worker answers by itself (its timings: DispatchObserver::prefill_phases).
    if (prefill != nullptr && !s.ok()) prefill->TryCancel();
    ReleasePending();
    if (active_ > 0) dispatcher_->registry_->AddLoad(worker_, 0, 0, -active_);
    if (down) {
      s = absl::UnavailableError(
          absl::StrCat("worker ", worker_,
                       " went down during the stream (its status stream broke or fell silent)"));
      retryable = true;
    } else if (mux_lost.has_value() && !(s.ok() && last_delivered_)) {
      s = absl::UnavailableError(*mux_lost);
      retryable = true;
    }
    // Refused before its first token as not fitting this worker (FAILED_PRECONDITION: another
    // encoder tower's rows) or as invalid, with images named by encoder handle: the next attempt
    // sends their bytes, which settle it (a request that is itself bad is refused again, then
    // with nothing to retry).
    if (!s.ok() && !started_ && !retryable && SentHandles() &&
        (s.code() == absl::StatusCode::kFailedPrecondition ||
         s.code() == absl::StatusCode::kInvalidArgument)) {
      retryable = true;
    }
    if (handoff_ && !started_ && s.ok()) HandoffCompleted();  // ended without a new token
    AttemptOutcome outcome;
    outcome.worker = worker_;
    outcome.failed = failed;
    outcome.status = s;
    outcome.started = started_;
    outcome.retryable = !s.ok() && retryable;
    outcome.migrate_cause =
        s.ok() ? "" : MigrationCause(down, has_error_ && !mux_lost.has_value(), s.code());
    outcome.error_event = has_error_;
    outcome.prefill_worker = prefill_worker;
    if (has_error_) outcome.handoff_endpoint = error_event_.error().handoff_endpoint();
    if (has_error_ && !started_ && !s.ok() && failed == worker_) {
      outcome.kv_blocks_needed = static_cast<int64_t>(error_event_.error().kv_blocks_needed());
    }
    dispatcher_->CallEnded(job_, outcome, has_error_ ? &error_event_ : nullptr);
    Unref();
  }

  bool SentHandles() const {
    for (const v1::PromptImage& image : request_.request().images()) {
      if (!image.embeddings_handle().empty()) return true;
    }
    return false;
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
        absl::MutexLock lock(&mu_);
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
    auto* rpc = new PrefillRpc(this, chosen->id, job_->record.Uncached(choice));
    rpc->context = std::make_shared<grpc::ClientContext>();
    rpc->context->set_deadline(absl::ToChronoTime(job_->request.deadline));
    rpc->context->AddMetadata(kTraceIdMetadataKey, job_->request.trace_id);
    AttachSharedToken(rpc->context.get(), token_);
    *rpc->request.mutable_request() = request_.request();
    *rpc->request.mutable_destination() = reservation;
    rpc->request.set_decode_endpoint(endpoint_);
    {
      absl::MutexLock lock(&mu_);
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

  void OnPrefillDone(const std::string& prefill_id, int64_t pending, const grpc::Status& status,
                     const v1::PrefillResponse& response) {
    dispatcher_->registry_->AddLoad(prefill_id, -1, -pending);
    if (status.ok() && dispatcher_->observer_.prefill_phases) {
      // Where the prefill's part of the first token's time went.
      dispatcher_->observer_.prefill_phases(
          response.queue_us() * 1e-6, response.compute_us() * 1e-6, response.transfer_us() * 1e-6,
          response.store_read_us() * 1e-6);
    }
    {
      absl::MutexLock lock(&mu_);
      prefill_done_ = true;
    }
    if (!status.ok()) {
      bool end_stream = false;
      {
        absl::MutexLock lock(&mu_);
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

  void Unref() override {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // The Prefill call the reservation asked for; deletes itself when it completed.
  struct PrefillRpc final : CompletionThread::Tag {
    PrefillRpc(Call* call, std::string worker, int64_t pending)
        : call(call), worker(std::move(worker)), pending(pending) {}
    void OnComplete(bool) override {
      call->OnPrefillDone(worker, pending, status, response);
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
  const SharedToken token_;
  const std::shared_ptr<grpc::ClientContext> context_;
  CompletionThread* completions_ = nullptr;
  std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateEvent>> reader_;
  MethodTag<Call> on_started_{this, &Call::OnStarted};
  MethodTag<Call> on_read_{this, &Call::OnRead};
  MethodTag<Call> on_finished_{this, &Call::OnFinished};
  grpc::Status status_;
  v1::GenerateEvent event_;
  // The sink's events, one at a time (from the call's thread and the token stream's), and what
  // they tell; written under deliver_mu_, read without it once the attempt ended (end_claimed_).
  absl::Mutex deliver_mu_;
  bool started_ = false;  // a token arrived
  bool retryable_ = false;
  bool has_error_ = false;
  bool last_delivered_ = false;  // Usage or ErrorInfo reached the sink
  v1::GenerateEvent error_event_;
  // The token stream: the attempt's route there (set by Start), the chunks that came through it,
  // the last event while it waits for more, whether the call ended (rpc_done_), whether the
  // attempt's end was claimed (by the call or the stream, once), and why the stream was lost.
  TokenStreamRoute route_;
  bool multiplexed_ = false;
  v1::GenerateEvent mux_event_ ABSL_GUARDED_BY(deliver_mu_);
  uint32_t mux_chunks_ ABSL_GUARDED_BY(deliver_mu_) = 0;
  v1::GenerateEvent held_last_ ABSL_GUARDED_BY(deliver_mu_);
  bool has_held_last_ ABSL_GUARDED_BY(deliver_mu_) = false;
  bool rpc_done_ ABSL_GUARDED_BY(deliver_mu_) = false;
  bool end_claimed_ ABSL_GUARDED_BY(deliver_mu_) = false;
  bool detached_ ABSL_GUARDED_BY(deliver_mu_) = false;
  std::optional<std::string> mux_lost_ ABSL_GUARDED_BY(deliver_mu_);
  // The stream's; +1 while the prefill call runs; +1 while attached to the token stream.
  std::atomic<int> refs_{1};
  absl::Mutex mu_;
  bool stream_done_ ABSL_GUARDED_BY(mu_) = false;
  bool down_ ABSL_GUARDED_BY(mu_) = false;  // the registry found worker_ down
  bool prefill_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string prefill_worker_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::ClientContext> prefill_context_ ABSL_GUARDED_BY(mu_);
  absl::Status prefill_status_ ABSL_GUARDED_BY(mu_);
  bool prefill_retryable_ ABSL_GUARDED_BY(mu_) = false;
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
      observer_(std::move(observer)),
      clock_(options_.clock != nullptr ? options_.clock : &RealClock()) {
  limits_.max_retries = options_.max_retries;
  limits_.max_migrations = options_.max_migrations;
  limits_.max_queued = options_.max_queued;
  limits_.max_queued_tokens = options_.max_queued_tokens;
  limits_.queue_timeout = options_.queue_timeout;
  tracking_.max_tokens_per_request = options_.max_tracked_tokens_per_request;
  tracking_.max_tokens = options_.max_tracked_tokens;
  completions_ = options_.completions;
  if (completions_.empty()) {
    own_completions_ = std::make_unique<CompletionThread>("dispatch");
    completions_.push_back(own_completions_.get());
  }
  TokenStreamHubOptions streams;
  streams.auth_token = options_.auth_token;
  streams.completions = completions_;
  streams.enabled = options_.token_streams;
  TokenStreamHubObserver stream_observer;
  stream_observer.streams = observer_.token_streams;
  stream_observer.message = observer_.token_stream_message;
  token_streams_ = std::make_unique<TokenStreamHub>(std::move(streams), std::move(stream_observer));
  timer_ = std::thread([this] { TimerLoop(); });
}

Dispatcher::~Dispatcher() {
  DropQueue(absl::UnavailableError("the router is shutting down"));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (running_ != 0 && !idle_cv_.WaitWithDeadline(&mu_, give_up)) {
    }
  }
  timer_.join();
}

absl::StatusOr<std::shared_ptr<Dispatcher::Job>> Dispatcher::Dispatch(
    DispatchRequest request, std::shared_ptr<GenerateSink> sink) {
  auto job = std::make_shared<Job>(std::move(request), std::move(sink));
  const int64_t tokens = job->record.prompt_tokens;
  {
    absl::MutexLock lock(&mu_);
    const Admission admission =
        AdmitNew(stopping_, static_cast<int64_t>(queue_.size()), queued_tokens_, tokens, limits_);
    if (admission.what == Admit::kReject) return admission.status;
    if (admission.what == Admit::kQueue) {  // behind the queue: arrival order
      EnterQueue(&job->record, clock_->Now());
      Enqueue(job, /*front=*/false);
      return job;
    }
  }
  if (TryStart(job)) return job;
  absl::MutexLock lock(&mu_);
  const Admission admission = AdmitUnstarted(stopping_, static_cast<int64_t>(queue_.size()),
                                             queued_tokens_, tokens, limits_);
  if (admission.what == Admit::kReject) return admission.status;
  EnterQueue(&job->record, clock_->Now());
  Enqueue(job, /*front=*/false);
  cv_.SignalAll();
  return job;
}

void Dispatcher::Enqueue(const std::shared_ptr<Job>& job, bool front) {
  job->record.queued = true;
  queued_tokens_ += job->record.prompt_tokens + job->record.resumed_tokens;
  if (front) {
    queue_.push_front(job);
  } else {
    queue_.push_back(job);
  }
  if (observer_.queue_depth)
    observer_.queue_depth(static_cast<int64_t>(queue_.size()), queued_tokens_);
}

void Dispatcher::Dequeued(const std::shared_ptr<Job>& job) {
  job->record.queued = false;
  queued_tokens_ -= job->record.prompt_tokens + job->record.resumed_tokens;
  if (observer_.queue_depth)
    observer_.queue_depth(static_cast<int64_t>(queue_.size()), queued_tokens_);
}

int64_t Dispatcher::CachedPositions(absl::Span<const Hash128> block_hashes, int64_t prompt_tokens,
                                    int64_t block_tokens) const {
  const std::vector<Candidate> candidates = registry_->Candidates();
  RouteRequest route;
  route.prompt_tokens = prompt_tokens;
  route.block_hashes = block_hashes;
  route.block_tokens = block_tokens;
  return policy_->CachedPositions(Views(candidates), route);
}

std::vector<WorkerLoadView> Dispatcher::Views(const std::vector<Candidate>& candidates) {
  std::vector<WorkerLoadView> views;
  views.reserve(candidates.size());
  for (const Candidate& c : candidates) views.push_back(c.load);
  return views;
}

std::vector<Candidate> Dispatcher::Subset(std::vector<Candidate> candidates,
                                          const std::vector<size_t>& indices) {
  std::vector<Candidate> picked;
  picked.reserve(indices.size());
  for (size_t i : indices) picked.push_back(std::move(candidates[i]));
  return picked;
}

RouteChoice Dispatcher::Choose(const std::vector<Candidate>& candidates,
                               const std::shared_ptr<Job>& job) {
  const RouteChoice choice = policy_->Choose(Views(candidates), job->record.Route());
  if (observer_.decided) observer_.decided(policy_->name(), choice);
  return choice;
}

absl::StatusOr<std::pair<Candidate, RouteChoice>> Dispatcher::PickPrefill(
    const std::shared_ptr<Job>& job) {
  std::vector<Candidate> candidates = registry_->Candidates();
  {
    absl::MutexLock lock(&mu_);
    candidates = Subset(std::move(candidates), PrefillCandidates(Views(candidates), job->record));
  }
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
  std::vector<Candidate> candidates = registry_->Candidates();
  const std::vector<WorkerLoadView> views = Views(candidates);
  bool handoff = false, cancelled = false;
  std::string fell_back_from;  // a hand-off source no worker can take the request from
  {
    absl::MutexLock lock(&mu_);
    if (job->record.ended) return true;  // nothing to start
    if (job->record.cancelled) {
      // The client left between two attempts (Cancel found no stream to cancel): it ends here.
      job->record.ended = true;
      cancelled = true;
    } else if (job->record.handoff.active()) {
      // A drain hand-off: a worker of the source's role (no prefill worker needed).
      std::vector<std::string> endpoints;
      endpoints.reserve(candidates.size());
      for (const Candidate& c : candidates) endpoints.push_back(c.endpoint);
      const std::vector<size_t> targets = HandoffTargets(views, endpoints, job->record);
      if (targets.empty()) {
        fell_back_from = job->record.handoff.source;
        job->record.handoff = HandoffPlan();
      } else {
        handoff = true;
        candidates = Subset(std::move(candidates), targets);
      }
    }
    if (!handoff && !cancelled) {
      candidates = Subset(std::move(candidates), StreamCandidates(views, job->record));
    }
  }
  if (cancelled) {
    Untrack(*job);
    job->sink->OnEnd(absl::CancelledError("the client went away"));
    return true;
  }
  if (!fell_back_from.empty()) {
    LOG(WARNING) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
                 << ": no worker can take its drain hand-off from " << fell_back_from
                 << "; resuming it by re-prefill";
    if (observer_.handoff) observer_.handoff("fell_back");
  }
  if (candidates.empty()) return false;
  const RouteChoice choice = Choose(candidates, job);
  const Candidate& chosen = candidates[choice.index];
  // An aggregated worker computes the prompt (not on a hand-off: its KV is pushed); a decode
  // worker holds it while it decodes.
  const bool decode = chosen.role == v1::WORKER_ROLE_DECODE;
  const int64_t pending = decode || handoff ? 0 : job->record.Uncached(choice);
  const int64_t active = decode ? job->record.prompt_tokens : 0;
  registry_->AddLoad(chosen.id, +1, pending, active);
  Call* call = nullptr;
  std::string attempt_id, source;
  int64_t carried = 0;
  int64_t inlined = 0;
  {
    absl::MutexLock lock(&mu_);
    ++job->record.attempts;
    call = new Call(this, job, job->Attempt(&inlined), job->record.resumed_tokens, chosen,
                    options_.auth_token, choice, pending, active);
    ++running_;
    job->context = call->context();
    job->call = call;
    job->record.role = KindOf(chosen.role);
    streaming_.insert(job);
    attempt_id = job->record.AttemptId();
    source = job->record.handoff.source;
    carried = job->record.resumed_tokens;
    job->record.precopy_target.clear();  // (of the attempt before)
    // The client left while this attempt was being chosen: it starts cancelled (and ends so).
    if (job->record.cancelled) call->context()->TryCancel();
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
  if (inlined > 0) {
    LOG(INFO) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id << " ("
              << attempt_id << "): " << inlined << " image(s) sent inline, not by encoder handle";
    if (observer_.images_inlined) observer_.images_inlined(inlined);
  }
  if (observer_.routed) observer_.routed(policy_->name(), chosen.id);
  job->sink->OnRouted(chosen.id);
  call->Start(chosen.stub, completions_[next_completion_.fetch_add(1) % completions_.size()]);
  return true;
}

void Dispatcher::PlanHandoff(const std::shared_ptr<Job>& job, const std::string& source,
                             const std::string& source_endpoint, const std::string& attempt_id,
                             absl::Time deadline) {
  std::vector<Candidate> candidates = registry_->Candidates();
  v1::PrefetchKvRequest prefetch;
  {
    absl::MutexLock lock(&mu_);
    if (job->record.ended || job->record.cancelled || job->record.choices != 1 ||
        job->record.AttemptId() != attempt_id || !job->record.precopy_target.empty()) {
      return;
    }
    // The targets the hand-off will have: of the source's role, not the source, not excluded.
    std::vector<size_t> targets;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const Candidate& c = candidates[i];
      if (c.load.kind != job->record.role || c.id == source || c.endpoint == source_endpoint ||
          job->record.excluded.count(c.id) > 0) {
        continue;
      }
      targets.push_back(i);
    }
    if (targets.empty()) return;
    candidates = Subset(std::move(candidates), targets);
    v1::GenerateRequest r = job->request.request;
    r.mutable_request()->mutable_context()->set_request_id(attempt_id);
    {
      absl::MutexLock progress(&job->progress_mu);
      *r.mutable_request()->mutable_resume() =
          ResumeFrom(job->record, job->request.request.request().sampling().seed());
    }
    r.mutable_request()->clear_store_hint();
    r.set_handoff_source_endpoint(source_endpoint);
    r.set_handoff_source_request_id(attempt_id);
    *prefetch.mutable_request() = std::move(r);
  }
  // The policy's choice among them (not counted as a routing decision: no attempt starts).
  const RouteChoice choice = policy_->Choose(Views(candidates), job->record.Route());
  const Candidate& target = candidates[choice.index];
  {
    absl::MutexLock lock(&mu_);
    if (job->record.AttemptId() != attempt_id || stopping_) return;
    job->record.precopy_target = target.id;
    ++running_;  // the destructor waits for the call's end
  }
  LOG(INFO) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id << " ("
            << attempt_id << "): worker " << source << " drains; pre-copying its KV to "
            << target.id << " for the hand-off";
  struct Rpc {
    grpc::ClientContext context;
    v1::PrefetchKvRequest request;
    v1::PrefetchKvResponse response;
  };
  auto rpc = std::make_shared<Rpc>();
  rpc->request = std::move(prefetch);
  // Useful only until the hand-off, bounded a little past the drain deadline.
  rpc->context.set_deadline(absl::ToChronoTime(
      std::min(job->request.deadline, std::max(deadline, absl::Now()) + absl::Seconds(5))));
  rpc->context.AddMetadata(kTraceIdMetadataKey, job->request.trace_id);
  AttachSharedToken(&rpc->context, options_.auth_token);
  std::shared_ptr<v1::Worker::Stub> stub = target.stub;
  const std::string trace_id = job->request.trace_id, target_id = target.id;
  stub->async()->PrefetchKv(
      &rpc->context, &rpc->request, &rpc->response,
      [this, rpc, stub, trace_id, attempt_id, target_id](grpc::Status status) {
        if (status.ok()) {
          LOG(INFO) << LogTraceId(trace_id) << "request " << trace_id << " (" << attempt_id
                    << "): pre-copy to " << target_id << " done: " << rpc->response.pushed_blocks()
                    << " blocks pushed (" << rpc->response.bytes_transferred() << " bytes), "
                    << rpc->response.cached_blocks() << " held there already";
        } else {
          LOG(INFO) << LogTraceId(trace_id) << "request " << trace_id << " (" << attempt_id
                    << "): pre-copy to " << target_id << " failed (" << status.error_message()
                    << "); the hand-off moves all of the KV";
        }
        if (observer_.precopy) observer_.precopy(status.ok() ? "done" : "failed");
        absl::MutexLock lock(&mu_);
        --running_;
        if (stopping_ && running_ == 0) idle_cv_.SignalAll();
      });
}

void Dispatcher::CallEnded(const std::shared_ptr<Job>& job, const AttemptOutcome& ended,
                           const v1::GenerateEvent* error) {
  registry_->AddLoad(ended.worker, -1);
  AttemptOutcome outcome = ended;
  if (outcome.kv_blocks_needed > 0) outcome.kv_reports = registry_->LoadReports(outcome.worker);
  Decision d;
  {
    absl::MutexLock lock(&mu_);
    --running_;
    job->context.reset();
    job->call = nullptr;
    streaming_.erase(job);
    {
      absl::MutexLock progress(&job->progress_mu);
      d = DecideAfterAttempt(job->record, outcome, limits_, clock_->Now());
      ApplyDecision(d, &job->record);
      if (d.next == Next::kMigrate) {
        job->resume = ResumeFrom(job->record, job->request.request.request().sampling().seed());
      }
    }
    if (stopping_ && running_ == 0) idle_cv_.SignalAll();  // only the destructor waits here
  }
  const std::string& trace_id = job->request.trace_id;
  if (d.collision) {
    LOG(ERROR) << LogTraceId(trace_id) << "request " << trace_id << ": worker " << outcome.failed
               << " already runs attempt " << d.stopped_attempt << " (" << outcome.status
               << "): the router reused an attempt id; restarting it under a new one";
    if (observer_.collision) observer_.collision();
  } else if (d.next == Next::kRetry) {
    LOG(INFO) << LogTraceId(trace_id) << "request " << trace_id << ": worker " << outcome.failed
              << " failed it before its first token (" << outcome.status << "); trying another";
    if (observer_.retried) observer_.retried();
  }
  if (d.next == Next::kQueue) {
    LOG(INFO) << LogTraceId(trace_id) << "request " << trace_id << ": decode worker "
              << outcome.worker << " has no room for its KV (" << d.kv_blocks_needed
              << " blocks); it waits for a decode worker with room";
    if (observer_.kv_wait) observer_.kv_wait();
  }
  if (!d.handoff_outcome.empty()) {
    if (d.handoff_outcome != "completed") {  // (completed: every choice had ended)
      LOG(WARNING) << LogTraceId(trace_id) << "request " << trace_id << ": its drain hand-off from "
                   << d.handoff_source << " to " << outcome.worker << " failed (" << outcome.status
                   << "); "
                   << (d.handoff_outcome == "fell_back" ? "resuming it by re-prefill"
                                                        : "it cannot go on");
    }
    if (observer_.handoff) observer_.handoff(d.handoff_outcome);
  }
  if (d.next == Next::kMigrate) {
    if (d.cause == "drain_handoff") {
      LOG(INFO) << LogTraceId(trace_id) << "request " << trace_id << ": worker " << outcome.worker
                << " stopped it draining; handing it off with " << d.carried
                << " output tokens to another worker";
    } else {
      LOG(WARNING) << LogTraceId(trace_id) << "request " << trace_id << ": worker "
                   << outcome.worker << " failed it mid-stream (" << d.cause << ": "
                   << outcome.status << "); moving it with " << d.carried
                   << " output tokens to another worker";
    }
    if (observer_.migrated) observer_.migrated(d.cause, d.carried);
  }
  // The abandoned attempt ends on every worker it touched before the next one starts (a worker
  // down now is told when it comes back).
  for (const std::string& id : d.abort_on) AbortOrphans(id, {d.stopped_attempt});
  if ((d.next == Next::kRetry || d.next == Next::kMigrate) && !TryStart(job)) {
    absl::MutexLock lock(&mu_);
    RestartFoundNoWorker(stopping_, &d);
  }
  if (d.next == Next::kQueue) {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      d.next = Next::kEnd;
      d.end = absl::UnavailableError("the router is shutting down");
      d.failure = "no_worker";
    } else {
      EnterQueue(&job->record, clock_->Now());
      Enqueue(job, /*front=*/true);  // it already waited its turn
      cv_.SignalAll();
    }
  }
  if (d.next == Next::kEnd) End(job, d, error);
  Pump();
}

void Dispatcher::End(const std::shared_ptr<Job>& job, const Decision& d,
                     const v1::GenerateEvent* error) {
  {
    absl::MutexLock lock(&mu_);
    job->record.ended = true;
  }
  Untrack(*job);
  if (!d.failure.empty()) {
    if (d.failure != "no_worker" || !d.end.ok()) {
      LOG(WARNING) << LogTraceId(job->request.trace_id) << "request " << job->request.trace_id
                   << " failed (" << d.failure << "): " << d.end;
    }
    if (observer_.failed) observer_.failed(d.failure);
  }
  if (error != nullptr && d.show_error_event) job->sink->OnEvent(*error);
  job->sink->OnEnd(d.end);
}

void Dispatcher::Record(Job& job, const v1::TokenChunk& chunk) {
  TrackResult result;
  {
    absl::MutexLock lock(&job.progress_mu);
    ReceivedChunk received;
    received.choice = chunk.choice_index();
    received.first_output_index = chunk.first_output_index();
    received.token_ids = absl::MakeConstSpan(chunk.token_ids().data(), chunk.token_ids_size());
    received.tail = chunk.stop_string_tail();
    received.finished = chunk.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
    int64_t delta = 0;
    result = Track(&job.record, received, tracked_tokens_.load(), tracking_, &delta);
    tracked_tokens_.fetch_add(delta);
  }
  if (result == TrackResult::kInconsistent) {
    LOG(WARNING) << LogTraceId(job.request.trace_id) << "request " << job.request.trace_id
                 << ": choice " << chunk.choice_index() << " continues at output "
                 << chunk.first_output_index()
                 << ", not where the router's record ends: it cannot migrate";
  }
  if ((result == TrackResult::kInconsistent || result == TrackResult::kOverCap) &&
      observer_.untracked) {
    observer_.untracked();
  }
}

void Dispatcher::Untrack(Job& job) {
  absl::MutexLock lock(&job.progress_mu);
  tracked_tokens_.fetch_sub(ferry::Untrack(&job.record));
}

void Dispatcher::OnWorkerState(const std::string& id, bool up) {
  if (up) {
    // Its token stream opens now, so that its first requests find it open (prefill workers
    // stream nothing).
    for (const Candidate& c : registry_->Candidates()) {
      if (c.id == id && c.role != v1::WORKER_ROLE_PREFILL) token_streams_->Open(id, c.stub);
    }
    std::vector<std::string> ids;
    {
      absl::MutexLock lock(&mu_);
      // Back (restarted, or its stall is over): a new chance for the jobs it failed.
      for (const std::shared_ptr<Job>& job : queue_) job->record.excluded.erase(id);
      for (const std::shared_ptr<Job>& job : streaming_) job->record.excluded.erase(id);
      auto it = orphans_.find(id);
      if (it == orphans_.end()) return;
      ids.assign(it->second.begin(), it->second.end());
      orphans_.erase(it);
    }
    return AbortOrphans(id, std::move(ids));
  }
  token_streams_->Close(id);
  absl::MutexLock lock(&mu_);
  for (const std::shared_ptr<Job>& job : streaming_) {
    if (job->call != nullptr) job->call->WorkerDown(id);
  }
}

void Dispatcher::KeepOrphan(const std::string& id, const std::string& attempt) {
  if (orphans_.size() >= 1024 && orphans_.count(id) == 0) {
    orphans_.erase(orphans_.begin());  // workers gone for good (addresses of the past)
  }
  std::deque<std::string>& orphans = orphans_[id];
  orphans.push_back(attempt);
  while (static_cast<int64_t>(orphans.size()) > options_.max_orphans_per_worker) {
    orphans.pop_front();
  }
}

void Dispatcher::AbortOrphans(const std::string& id, std::vector<std::string> ids) {
  std::shared_ptr<v1::Worker::Stub> stub = registry_->UpStub(id);
  if (stub == nullptr) {
    // Down (or gone): keep them for its return.
    absl::MutexLock lock(&mu_);
    for (const std::string& attempt : ids) KeepOrphan(id, attempt);
    return;
  }
  if (ids.size() > 1) {
    LOG(INFO) << "worker " << id << " is back: aborting " << ids.size()
              << " requests that moved away from it";
  }
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
    rpc->request.set_reason("the request went on under another attempt");
    {
      absl::MutexLock lock(&mu_);
      ++running_;  // the destructor waits for it
    }
    stub->async()->Abort(&rpc->context, &rpc->request, &rpc->response,
                         [this, rpc, stub, id](grpc::Status status) {
                           if (observer_.orphan_abort) {
                             observer_.orphan_abort(!status.ok()            ? "failed"
                                                    : rpc->response.found() ? "found"
                                                                            : "not_found");
                           }
                           absl::MutexLock lock(&mu_);
                           // Unreachable now (it went down meanwhile): told again when it comes
                           // back.
                           if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                               status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
                             KeepOrphan(id, rpc->request.request_id());
                           }
                           --running_;
                           if (stopping_ && running_ == 0) idle_cv_.SignalAll();
                         });
  }
}

void Dispatcher::Pump() {
  while (true) {
    std::shared_ptr<Job> job;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return;
      job = queue_.front();
      queue_.pop_front();
      Dequeued(job);
    }
    if (!TryStart(job)) {
      absl::MutexLock lock(&mu_);
      Enqueue(job, /*front=*/true);  // (its wait goes on: EnterQueue is not called again)
      return;
    }
    absl::Duration stay;
    const char* pool;
    {
      absl::MutexLock lock(&mu_);
      stay = LeaveQueue(&job->record, clock_->Now());
      pool = QueuePool({}, job->record, /*started=*/true);
    }
    if (observer_.queue_wait) observer_.queue_wait(pool, absl::ToDoubleSeconds(stay));
  }
}

void Dispatcher::Cancel(const std::shared_ptr<Job>& job) {
  std::shared_ptr<grpc::ClientContext> context;
  bool was_queued = false;
  {
    absl::MutexLock lock(&mu_);
    if (job->record.cancelled || job->record.ended) return;
    job->record.cancelled = true;
    if (job->record.queued) {
      queue_.erase(std::remove(queue_.begin(), queue_.end(), job), queue_.end());
      Dequeued(job);
      LeaveQueue(&job->record, clock_->Now());
      job->record.ended = true;
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
    absl::MutexLock lock(&mu_);
    dropped.swap(queue_);
    queued_tokens_ = 0;
    for (auto& job : dropped) {
      job->record.queued = false;
      LeaveQueue(&job->record, clock_->Now());
      job->record.ended = true;
    }
    if (observer_.queue_depth) observer_.queue_depth(0, 0);
  }
  for (auto& job : dropped) {
    Untrack(*job);
    job->sink->OnEnd(why);
  }
}

void Dispatcher::TimerLoop() {
  mu_.Lock();
  while (!stopping_) {
    cv_.WaitWithTimeout(&mu_, absl::Milliseconds(100));
    // Queued requests that waited their longest (queue_timeout, or their deadline).
    const absl::Time now = clock_->Now();
    const bool any_up = registry_->AnyUp();
    struct Expired {
      std::shared_ptr<Job> job;
      QueueExpiry expiry;
      absl::Duration stay;
      const char* pool;
    };
    std::vector<WorkerLoadView> views;  // for the pools of the requests that expire (rare)
    std::vector<Expired> ended;
    for (auto it = queue_.begin(); it != queue_.end();) {
      QueueExpiry expiry =
          QueuedWait((*it)->record, now, WaitCause((*it)->record, any_up), limits_);
      if (expiry.expired()) {
        std::shared_ptr<Job> job = *it;
        it = queue_.erase(it);
        Dequeued(job);
        const absl::Duration stay = LeaveQueue(&job->record, now);
        job->record.ended = true;
        if (views.empty()) views = Views(registry_->Candidates());
        const char* pool = QueuePool(views, job->record, /*started=*/false);
        ended.push_back({std::move(job), std::move(expiry), stay, pool});
      } else {
        ++it;
      }
    }
    const bool pump = !queue_.empty();
    mu_.Unlock();
    for (Expired& e : ended) {
      Untrack(*e.job);
      LOG(WARNING) << LogTraceId(e.job->request.trace_id) << "request " << e.job->request.trace_id
                   << " failed (" << e.expiry.reason << "): " << e.expiry.status;
      if (observer_.queue_wait) observer_.queue_wait(e.pool, absl::ToDoubleSeconds(e.stay));
      if (observer_.queue_expired) observer_.queue_expired(e.expiry.reason);
      if (observer_.failed) observer_.failed(FailureCause(e.expiry.status));
      e.job->sink->OnEnd(e.expiry.status);
    }
    if (pump) Pump();  // in case a worker freed up without a registry change
    mu_.Lock();
  }
  mu_.Unlock();
}

int64_t Dispatcher::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(queue_.size());
}

int64_t Dispatcher::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace ferry
