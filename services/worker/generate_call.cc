#include "services/worker/generate_call.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"
#include "services/worker/worker_service.h"
#include "services/worker/worker_wire.h"

namespace ferry {

namespace v1 = ferry::v1;

GenerateCall::GenerateCall(WorkerService* service, grpc::CallbackServerContext* context,
                           const v1::GenerateRequest* request)
    : service_(service),
      context_(context),
      start_(std::chrono::steady_clock::now()),
      cause_(AbortCause::kNone) {
  Start(*request);
}

void GenerateCall::Reject(const grpc::Status& status, bool invalid) {
  service_->metrics().Outcome(invalid ? RequestOutcome::kInvalid : RequestOutcome::kRejected);
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
  Finish(status);
}

void GenerateCall::Start(const v1::GenerateRequest& request) {
  if (grpc::Status auth = service_->Authorize(*context_); !auth.ok()) return Reject(auth, false);
  if (service_->draining()) {
    return Reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the worker is draining: it admits no new requests"),
                  false);
  }
  if (!request.aggregated()) {
    return Reject(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "this worker runs the aggregated role: Generate needs "
                               "`aggregated` (disaggregated requests go to a decode worker)"),
                  true);
  }
  if (!request.handoff_source_endpoint().empty()) {
    return Reject(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                               "KV hand-off from another decode worker is not supported by the "
                               "aggregated worker"),
                  true);
  }
  std::vector<int64_t> first_index;
  absl::StatusOr<EngineRequest> converted =
      ToEngineRequest(request.request(), service_->limits(), &first_index);
  if (!converted.ok()) return Reject(ToGrpcStatus(converted.status()), true);
  EngineRequest r = *std::move(converted);
  const v1::RequestContext& ctx = request.request().context();
  id_ = r.id;
  trace_id_ = ctx.trace_id().empty() ? TraceIdOf(*context_) : ctx.trace_id();
  logprobs_ = r.sampling.top_logprobs >= 0;
  seed_ = r.sampling.seed;
  prompt_tokens_ = static_cast<int64_t>(r.prompt.size());
  pending_.resize(r.n);
  has_pending_.assign(r.n, false);
  next_index_ = first_index;
  choices_left_ = r.n;
  if (!service_->Register(id_, this)) {
    return Reject(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                               absl::StrCat("request ", id_, " is already running here")),
                  true);
  }
  if (ctx.deadline_unix_ms() > 0) {
    deadline_ = absl::FromUnixMillis(ctx.deadline_unix_ms());
    service_->deadlines().Add(id_, deadline_);
  }
  r.on_event = [this](const TokenEvent& e) { OnEngineEvent(e); };
  refs_.fetch_add(1);
  const absl::Status submitted = service_->engine().engine().Submit(std::move(r));
  if (!submitted.ok()) {
    refs_.fetch_sub(1);
    if (deadline_ != absl::InfiniteFuture()) service_->deadlines().Remove(id_, deadline_);
    service_->Unregister(id_);
    return Reject(ToGrpcStatus(submitted),
                  submitted.code() == absl::StatusCode::kInvalidArgument ||
                      submitted.code() == absl::StatusCode::kAlreadyExists);
  }
}

void GenerateCall::AbortFor(AbortCause cause) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine_done_) return;
    if (cause_ == AbortCause::kNone) cause_ = cause;
  }
  service_->engine().engine().Abort(id_);
}

void GenerateCall::OnEngineEvent(const TokenEvent& e) {
  bool done = false, failed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t c = static_cast<size_t>(e.choice);
    if (e.has_token && !first_token_) {
      first_token_ = true;
      service_->metrics().Ttft(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
    if (e.has_token || !e.text.empty() || e.finish != FinishReason::kNone) {
      if (!has_pending_[c]) {
        pending_[c].Clear();
        pending_[c].set_request_id(id_);
        pending_[c].set_choice_index(static_cast<uint32_t>(c));
        pending_[c].set_first_output_index(static_cast<uint32_t>(next_index_[c]));
        has_pending_[c] = true;
      }
      AppendToChunk(e, logprobs_, &pending_[c]);
    }
    if (e.has_token) {
      ++next_index_[c];
      ++completion_tokens_;
    }
    cached_tokens_ = std::max(cached_tokens_, e.cached_tokens);
    if (e.finish != FinishReason::kNone) {
      if (e.finish == FinishReason::kError && error_.ok()) {
        failed = true;
        error_ = absl::Status(
            e.error_code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : e.error_code,
            e.error.empty() ? "the engine failed the request" : e.error);
      }
      done = --choices_left_ == 0;
    }
  }
  if (failed && !done) service_->engine().engine().Abort(id_);  // the other choices too
  if (done) {
    RequestOutcome outcome = RequestOutcome::kCompleted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      switch (cause_) {
        case AbortCause::kAbortCall:
          outcome = RequestOutcome::kAborted;
          break;
        case AbortCause::kCancelled:
          outcome = RequestOutcome::kCancelled;
          break;
        case AbortCause::kDeadline:
          outcome = RequestOutcome::kDeadlineExceeded;
          break;
        case AbortCause::kDrained:
          outcome = RequestOutcome::kDrained;
          break;
        case AbortCause::kNone:
          outcome = error_.ok() ? RequestOutcome::kCompleted : RequestOutcome::kError;
          break;
      }
      if (first_token_) {
        service_->metrics().PromptTokens(prompt_tokens_ - cached_tokens_, cached_tokens_);
      }
    }
    service_->metrics().Outcome(outcome);
    if (deadline_ != absl::InfiniteFuture()) service_->deadlines().Remove(id_, deadline_);
    service_->Unregister(id_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine_done_ = true;
    }
  }
  Pump();
  if (done) Unref();
}

void GenerateCall::Pump() {
  std::unique_lock<std::mutex> lock(mu_);
  if (writing_ || finished_) return;
  if (broken_ || cause_ == AbortCause::kCancelled) {
    // Nobody reads any more: finish once the engine let go of the request.
    if (engine_done_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
    }
    return;
  }
  const size_t n = pending_.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t c = (next_choice_ + k) % n;
    if (!has_pending_[c]) continue;
    next_choice_ = c + 1;
    out_.Clear();
    out_.mutable_tokens()->Swap(&pending_[c]);
    has_pending_[c] = false;
    writing_ = true;
    lock.unlock();
    StartWrite(&out_);
    return;
  }
  if (!engine_done_) return;
  // Every choice ended and was written: Usage (OK) or an error.
  absl::Status final_status;
  bool retryable = false;
  if (cause_ == AbortCause::kDeadline) {
    final_status = absl::DeadlineExceededError("the request's deadline passed");
  } else if (cause_ == AbortCause::kDrained) {
    final_status = absl::UnavailableError("the worker drained before the request finished");
    retryable = true;
  } else if (!error_.ok()) {
    final_status = error_;
    retryable = error_.code() == absl::StatusCode::kResourceExhausted ||
                error_.code() == absl::StatusCode::kUnavailable;
  }
  if (closing_sent_) {
    finished_ = true;
    Finish(ToGrpcStatus(final_status));
    return;
  }
  closing_sent_ = true;
  out_.Clear();
  if (final_status.ok()) {
    v1::Usage* usage = out_.mutable_usage();
    usage->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens_));
    usage->set_completion_tokens(static_cast<uint32_t>(completion_tokens_));
    usage->set_cached_tokens(static_cast<uint32_t>(cached_tokens_));
    usage->mutable_cached_by_source()->set_local(static_cast<uint32_t>(cached_tokens_));
  } else {
    ErrorInfoFromStatus(final_status, trace_id_, retryable, out_.mutable_error());
  }
  writing_ = true;
  lock.unlock();
  StartWrite(&out_);
}

void GenerateCall::OnWriteDone(bool ok) {
  bool abort = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      broken_ = true;
      abort = !engine_done_;
      if (abort && cause_ == AbortCause::kNone) cause_ = AbortCause::kCancelled;
    }
  }
  if (abort) service_->engine().engine().Abort(id_);
  Pump();
}

void GenerateCall::OnCancel() {
  bool abort = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    abort = !engine_done_ && refs_.load() > 1;
    if (abort && cause_ == AbortCause::kNone) cause_ = AbortCause::kCancelled;
  }
  if (abort) service_->engine().engine().Abort(id_);
  Pump();
}

void GenerateCall::OnDone() { Unref(); }

void GenerateCall::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

}  // namespace ferry
