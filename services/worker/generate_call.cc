#include "services/worker/generate_call.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/block_hash.h"
#include "engine/common/log.h"
#include "engine/prompt_image.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"
#include "services/common/shared_token.h"
#include "services/worker/kv_handoff.h"
#include "services/worker/worker_service.h"
#include "services/worker/worker_wire.h"

namespace ferry {

GenerateCall::GenerateCall(WorkerService* service, grpc::CallbackServerContext* context,
                           const v1::GenerateRequest* request)
    : service_(service),
      context_(context),
      start_(std::chrono::steady_clock::now()),
      cause_(AbortCause::kNone) {
  service_->CallCreated();
  if ((!HasImageBytes(request->request()) && !HasImageHandles(request->request())) ||
      !service_->encodes_images()) {
    Start(*request);
    return;
  }
  // Image bytes are decoded and encoded on the worker's image executor, not on this gRPC thread
  // (the request message lives until OnDone, which our reference keeps away).
  Ref();
  const bool queued = service_->AddImageWork([this, request] {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      cancelled = broken_ || cause_ != AbortCause::kNone;
    }
    if (cancelled) {
      service_->metrics().Outcome(RequestOutcome::kCancelled);
      absl::MutexLock lock(&mu_);
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
    } else {
      Start(*request);
    }
    Unref();
    return !cancelled;
  });
  if (!queued) {
    Unref();
    Reject(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "the worker's image encoding queue is full"),
           false);
  }
}

GenerateCall::~GenerateCall() {
  if (stream_ != nullptr) stream_->Unref();
  service_->CallGone();
}

void GenerateCall::Reject(const grpc::Status& status, bool invalid) {
  // CANCELLED before the engine: the caller left while the request's embeddings were fetched.
  service_->metrics().Outcome(status.error_code() == grpc::StatusCode::CANCELLED
                                  ? RequestOutcome::kCancelled
                              : invalid ? RequestOutcome::kInvalid
                                        : RequestOutcome::kRejected);
  absl::MutexLock lock(&mu_);
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
  const std::string& role = service_->role();
  if (role == "prefill") {
    return Reject(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "this worker runs the prefill role: Generate goes to a decode or "
                               "aggregated worker, Prefill comes here"),
                  true);
  }
  if (role == "aggregated" && !request.aggregated()) {
    return Reject(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "this worker runs the aggregated role: Generate needs "
                               "`aggregated` (disaggregated requests go to a decode worker)"),
                  true);
  }
  if (role == "decode" && request.aggregated()) {
    return Reject(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "this worker runs the decode role: its requests are prefilled by "
                               "a prefill worker (`aggregated` must be unset)"),
                  true);
  }
  if (!request.handoff_source_endpoint().empty() && service_->transport() == nullptr) {
    return Reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "this worker has no KV transport: a drained request's KV cannot "
                               "be handed to it (resume it by re-prefill)"),
                  false);
  }
  // Embeddings held by an encoder are fetched first (Start runs on the image executor then).
  FetchedImages fetched;
  if (absl::Status s =
          service_->FetchImages(*context_, request.request(), &fetch_cancel_, &fetched);
      !s.ok()) {
    LOG(WARNING) << LogTraceId(request.request().context().trace_id()) << "request "
                 << request.request().context().request_id() << ": " << s;
    return Reject(ToGrpcStatus(s), s.code() == absl::StatusCode::kInvalidArgument ||
                                       s.code() == absl::StatusCode::kFailedPrecondition);
  }
  std::vector<int64_t> first_index;
  absl::StatusOr<EngineRequest> converted =
      ToEngineRequest(request.request(), service_->limits(), &first_index, &fetched);
  if (!converted.ok()) return Reject(ToGrpcStatus(converted.status()), true);
  EngineRequest r = *std::move(converted);
  if (!request.handoff_source_endpoint().empty()) {
    if (r.n != 1 || r.resume.size() != 1 || r.resume[0].generated.empty()) {
      return Reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a hand-off (handoff_source_endpoint) continues one choice: it "
                                 "needs n = 1 and a resume state with the output so far"),
                    true);
    }
    if (request.handoff_source_request_id().empty()) {
      return Reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a hand-off needs handoff_source_request_id: the request's id "
                                 "on the source"),
                    true);
    }
    handoff_source_ = request.handoff_source_endpoint();
    handoff_source_id_ = request.handoff_source_request_id();
    handoff_generated_ = static_cast<int64_t>(r.resume[0].generated.size());
  }
  const v1::RequestContext& ctx = request.request().context();
  id_ = r.id;
  trace_id_ = ctx.trace_id().empty() ? TraceIdOf(*context_) : ctx.trace_id();
  logprobs_ = r.sampling.top_logprobs >= 0;
  seed_ = r.sampling.seed;
  prompt_tokens_ = static_cast<int64_t>(r.prompt.size());
  if (!request.token_stream_id().empty()) {
    // A stream this worker does not hold (not opened yet, closed): the events go on this call.
    stream_ = service_->FindTokenStream(request.token_stream_id());
    tag_ = request.token_stream_tag();
  }
  {
    // (Nobody else sees the call yet; the lock is for the annotations.)
    absl::MutexLock lock(&mu_);
    pending_.resize(r.n);
    has_pending_.assign(r.n, false);
    next_index_ = first_index;
    choices_left_ = r.n;
  }
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
  service_->WriteComputedBlocks(r, ctx);
  if (role == "decode" || !handoff_source_.empty()) {
    // A migrated request (one choice): the prefill worker computes the prompt and the output so
    // far and samples the next token; their KV comes here. A hand-off's KV is the source's: the
    // prompt and the output but its last token.
    if (!r.resume.empty() && r.n != 1) {
      if (deadline_ != absl::InfiniteFuture()) service_->deadlines().Remove(id_, deadline_);
      service_->Unregister(id_);
      return Reject(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                 "resuming a disaggregated request with several choices is not "
                                 "supported"),
                    true);
    }
    if (absl::Status valid = service_->engine().engine().Validate(r); !valid.ok()) {
      if (deadline_ != absl::InfiniteFuture()) service_->deadlines().Remove(id_, deadline_);
      service_->Unregister(id_);
      return Reject(ToGrpcStatus(valid), true);
    }
    // Reserve first: the prompt's blocks (and a migrated request's output so far), the cached
    // prefix taken here.
    std::vector<TokenId> computed = r.prompt;
    if (!r.resume.empty()) {
      computed.insert(computed.end(), r.resume[0].generated.begin(), r.resume[0].generated.end());
      if (!handoff_source_.empty()) computed.pop_back();
    }
    const std::vector<Hash128> hashes =
        ComputeBlockHashes({service_->limits().model_fingerprint, r.cache_salt, ""}, computed,
                           service_->limits().block_tokens, ImageSpans(r.images));
    const int64_t positions = static_cast<int64_t>(computed.size());
    {
      absl::MutexLock lock(&mu_);
      phase_ = Phase::kReserving;
      reservation_deadline_ = std::min(deadline_, absl::Now() + service_->reservation_timeout());
      const int64_t bt = std::max<int64_t>(1, service_->limits().block_tokens);
      reservation_blocks_ = (positions + bt - 1) / bt;
      decode_request_ = std::move(r);
    }
    refs_.fetch_add(2);  // the request's (until Done), the reservation callback's
    service_->engine().engine().Reserve(
        hashes, positions,
        [this](absl::StatusOr<KvReservation> got) { OnReserved(std::move(got)); });
    return;
  }
  refs_.fetch_add(1);
  if (StoreReader* reader = service_->store_reader(); reader != nullptr) {
    {
      absl::MutexLock lock(&mu_);
      phase_ = Phase::kLoading;
    }
    reader->Read(
        std::move(r), deadline_,
        [this](EngineRequest read, const StoreRead&) { SubmitRead(std::move(read)); },
        StoreHintFromProto(request.request()));
    return;
  }
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

void GenerateCall::SubmitRead(EngineRequest r) {
  std::vector<BlockId> imports = r.imported_blocks;
  absl::Status submitted;
  {
    absl::MutexLock lock(&mu_);
    if (cause_ != AbortCause::kNone) {
      submitted = absl::CancelledError("the request ended while its prefix was read");
    } else {
      // Submitted under mu_: an abort from here on finds the request in the engine.
      phase_ = Phase::kSubmitted;
      submitted = service_->engine().engine().Submit(std::move(r));
      if (!submitted.ok()) {
        error_ = submitted;
        refused_ = true;
      }
    }
    if (!submitted.ok()) phase_ = Phase::kEnded;
  }
  if (submitted.ok()) return;
  // The engine never had it: the imports are still ours, and no event will end the call.
  if (!imports.empty()) {
    CHECK_OK(service_->engine().pool().Release(imports));
  }
  Done();
}

void GenerateCall::AbortFor(AbortCause cause) {
  bool park = false;
  {
    mu_.Lock();
    if (engine_done_) {
      mu_.Unlock();
      return;
    }
    // The drain's first word to a running request is a park: it ends only if the engine parks it
    // (kHandoff), and may still finish on its own (several choices); a second one ends it.
    park = cause == AbortCause::kDrained && service_->hands_off() && phase_ == Phase::kSubmitted &&
           !park_requested_;
    if (park) {
      park_requested_ = true;
    } else if (cause_ == AbortCause::kNone) {
      cause_ = cause;
    }
    if (phase_ == Phase::kReserving || phase_ == Phase::kAwaitingKv) {
      return EndBeforeEngine(cause, absl::OkStatus());
    }
    if (phase_ != Phase::kSubmitted) {
      mu_.Unlock();
      return;
    }
    mu_.Unlock();
  }
  if (park) {
    service_->engine().engine().Park(id_);
  } else {
    service_->engine().engine().Abort(id_);
  }
}

void GenerateCall::PlanHandoff(absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (planned_ || phase_ != Phase::kSubmitted || engine_done_ || finished_ || broken_ ||
        pending_.size() != 1) {
      return;
    }
    planned_ = plan_ready_ = true;
    plan_deadline_ = deadline;
  }
  Pump();
}

void GenerateCall::OnReserved(absl::StatusOr<KvReservation> reserved) {
  mu_.Lock();
  if (phase_ != Phase::kReserving) {
    // Ended meanwhile: the reservation was never sent, so no push can reach its blocks.
    if (reserved.ok()) {
      auto kv = IncomingKv::Await(service_->transport(), &service_->engine().pool(),
                                  service_->engine().window_pool(), *std::move(reserved), {},
                                  absl::Now(), absl::ZeroDuration(), {}, nullptr);
      kv->Abandon();
    }
    mu_.Unlock();
    Unref();
    return;
  }
  if (!reserved.ok()) {
    service_->metrics().Reservation("no_blocks");
    kv_refused_ = true;
    EndBeforeEngine(AbortCause::kNone,
                    absl::ResourceExhaustedError(
                        absl::StrCat("the decode worker cannot reserve KV for the prompt now: ",
                                     reserved.status().message())));
    Unref();
    return;
  }
  const bool two_pools = service_->engine().window_pool() != nullptr;
  transfer_id_ = absl::StrCat(id_, "/", RandomTransferSuffix());
  std::vector<std::string> ids = {transfer_id_};
  if (two_pools) ids.push_back(transfer_id_ + "/window");
  KvLanding landing;
  auto described =
      DescribeReservation(id_, *reserved, service_->reservation_target(), service_->kv_facts(),
                          ids[0], two_pools ? ids[1] : "", reservation_deadline_, &landing);
  // Awaited before the reservation leaves: the blocks are the IncomingKv's from here.
  refs_.fetch_add(1);  // the landing callback's
  WorkerService* service = service_;
  kv_ = IncomingKv::Await(
      service_->transport(), &service_->engine().pool(), service_->engine().window_pool(),
      *std::move(reserved), ids, reservation_deadline_, service_->reservation_quarantine(),
      std::move(landing),
      [this](absl::Status s) {
        OnKvLanded(s);
        Unref();
      },
      [service, id = transfer_id_](int64_t blocks, bool known) {
        service->metrics().KvReleased(blocks, known);
        service->RemoveIncoming(id);
      });
  service_->AddIncoming(transfer_id_, kv_);
  if (!described.ok()) {
    kv_->NoTransfer();  // never sent: nobody can push into it
    if (described.status().code() == absl::StatusCode::kResourceExhausted) {
      // The staging area is full now (kv_staging.h): a transient, as a full pool is.
      service_->metrics().Reservation("no_staging");
      kv_refused_ = true;
      EndBeforeEngine(AbortCause::kNone,
                      absl::ResourceExhaustedError(
                          absl::StrCat("the decode worker cannot stage KV for the prompt now: ",
                                       described.status().message())));
    } else {
      LOG(ERROR) << LogTraceId(trace_id_) << "request " << id_ << ": " << described.status();
      EndBeforeEngine(AbortCause::kNone, described.status());
    }
    Unref();
    return;
  }
  phase_ = Phase::kAwaitingKv;
  reservation_ = *std::move(described);
  reservation_ready_ = true;
  // KvReady is bounded too: the pushes by reservation_deadline_, KvReady a second later.
  kv_deadline_ = reservation_deadline_ + absl::Seconds(1);
  service_->deadlines().Add(id_ + WorkerService::kKvDeadlineSuffix, kv_deadline_);
  const bool handoff = !handoff_source_.empty();
  mu_.Unlock();
  Pump();
  if (handoff) CallPushKv();
  Unref();
}

void GenerateCall::CallPushKv() {
  struct Rpc {
    std::unique_ptr<grpc::ClientContext> context;
    v1::PushKvRequest request;
    v1::PushKvResponse response;
  };
  auto rpc = std::make_shared<Rpc>();
  absl::Duration timeout;
  {
    absl::MutexLock lock(&mu_);
    rpc->request.set_request_id(handoff_source_id_);
    *rpc->request.mutable_destination() = reservation_;
    rpc->request.set_generated_tokens(static_cast<uint32_t>(handoff_generated_));
    timeout = std::max(absl::Milliseconds(1), reservation_deadline_ - absl::Now());
  }
  rpc->context = NewClientContext(timeout, trace_id_);
  AttachSharedToken(rpc->context.get(), service_->options().auth_token);
  auto stub = service_->DecodeStub(handoff_source_);
  refs_.fetch_add(1);  // the PushKv call's
  stub->async()->PushKv(
      rpc->context.get(), &rpc->request, &rpc->response, [this, rpc, stub](grpc::Status status) {
        mu_.Lock();
        if (phase_ != Phase::kAwaitingKv) {
          mu_.Unlock();
          Unref();
          return;
        }
        if (!status.ok()) {
          service_->metrics().Reservation("failed");
          LOG(WARNING) << LogTraceId(trace_id_) << "request " << id_ << ": the hand-off from "
                       << handoff_source_ << " failed: " << status.error_message();
          if (status.error_code() != grpc::StatusCode::NOT_FOUND) {
            // The source may have started puts: the transport's outcome frees the blocks.
          } else {
            kv_->NoTransfer();  // nothing was posted into the reservation
          }
          EndBeforeEngine(AbortCause::kNone, absl::UnavailableError(absl::StrCat(
                                                 "the KV hand-off from ", handoff_source_,
                                                 " failed: ", status.error_message())));
          Unref();
          return;
        }
        // As a prefill worker's KvReady: what the decode-only request needs besides the blocks.
        service_->metrics().HandoffReceived(rpc->response.bytes_transferred());
        kv_ready_ = true;
        ready_.Clear();
        ready_.set_request_id(id_);
        ready_.set_transfer_id(transfer_id_);
        ready_.set_window_floor(rpc->response.window_floor());
        ready_.set_approximate_kv(rpc->response.approximate_kv());
        ContinueOnceKvIsIn();
        Unref();
      });
}

void GenerateCall::OnKvLanded(const absl::Status& status) {
  mu_.Lock();
  if (phase_ != Phase::kAwaitingKv) {
    mu_.Unlock();
    return;
  }
  if (!status.ok()) {
    service_->metrics().Reservation(
        status.code() == absl::StatusCode::kDeadlineExceeded ? "timed_out" : "failed");
    return EndBeforeEngine(
        AbortCause::kNone,
        absl::UnavailableError(absl::StrCat("the prefill worker's KV did not arrive",
                                            status.code() == absl::StatusCode::kDeadlineExceeded
                                                ? " by the reservation's deadline"
                                                : "",
                                            ": ", status.message())));
  }
  kv_landed_ = true;
  ContinueOnceKvIsIn();
}

void GenerateCall::ContinueOnceKvIsIn() {
  if (!kv_landed_ || !kv_ready_) {
    mu_.Unlock();
    Pump();  // the reservation, if still unwritten
    return;
  }
  const bool ended = PrepareDecodeLocked();
  mu_.Unlock();
  if (ended) {
    Done();
  } else {
    StartDecode();
  }
}

grpc::Status GenerateCall::OnKvReady(const v1::KvReadyRequest& ready) {
  mu_.Lock();
  // The first tokens come once; after them only the push's failure may (the prefill worker
  // sends the first tokens while it pushes the KV).
  if (phase_ != Phase::kAwaitingKv || (kv_ready_ && !ready.has_error())) {
    mu_.Unlock();
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("request ", id_, " is not waiting for its KV"));
  }
  if (ready.transfer_id() != transfer_id_) {
    mu_.Unlock();
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("transfer ", ready.transfer_id(), " is not request ", id_, "'s reservation"));
  }
  if (ready.has_error() || ready.no_transfer()) {
    if (ready.no_transfer()) kv_->NoTransfer();
  }
  if (ready.has_error()) {
    service_->metrics().Reservation("failed");
    const v1::ErrorInfo& e = ready.error();
    EndBeforeEngine(
        AbortCause::kNone,
        absl::Status(e.status_code() == 0 ? absl::StatusCode::kUnavailable
                                          : static_cast<absl::StatusCode>(e.status_code()),
                     absl::StrCat("prefill failed: ", e.message())));
    return grpc::Status::OK;
  }
  if (static_cast<size_t>(ready.first_tokens_size()) != pending_.size()) {
    const size_t choices = pending_.size();
    mu_.Unlock();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("KvReady has ", ready.first_tokens_size(),
                                     " first tokens for ", choices, " choices"));
  }
  kv_ready_ = true;
  ready_ = ready;
  if (ready.no_transfer()) kv_landed_ = true;  // nothing was pushed: every choice ended at P
  ContinueOnceKvIsIn();
  return grpc::Status::OK;
}

void GenerateCall::OnKvDeadline() {
  mu_.Lock();
  if (phase_ != Phase::kAwaitingKv) {
    mu_.Unlock();
    return;
  }
  service_->metrics().Reservation("timed_out");
  EndBeforeEngine(AbortCause::kNone,
                  absl::UnavailableError(
                      kv_landed_ ? "the prefill worker pushed the KV but did not call KvReady by "
                                   "the reservation's deadline"
                                 : "the prefill worker's KV did not arrive by the reservation's "
                                   "deadline"));
}

bool GenerateCall::PrepareDecodeLocked() {
  phase_ = Phase::kStarting;
  ClearKvDeadline();
  service_->metrics().Reservation("landed");
  EngineRequest r = std::move(decode_request_);
  cached_tokens_ = ready_.usage().cached_tokens();  // reused on the prefill worker
  store_tokens_ = ready_.usage().cached_by_source().store();
  decode_local_tokens_ =
      std::min<int64_t>(prompt_tokens_, static_cast<int64_t>(reservation_.cached_prefix_blocks()) *
                                            service_->limits().block_tokens);
  // A migrated request's output before the prefill worker's token (its resume point).
  std::vector<ResumePoint> before = std::move(r.resume);
  r.resume.clear();
  if (!handoff_source_.empty()) {
    // A hand-off: the source's KV covers all but the last token, which the client has; the
    // request continues from the caller's resume point as it is, and no prompt token was
    // computed for it.
    r.resume = std::move(before);
    cached_tokens_ = prompt_tokens_;
    store_tokens_ = 0;
  }
  for (int c = 0; c < ready_.first_tokens_size(); ++c) {
    const v1::TokenChunk& first = ready_.first_tokens(c);
    pending_[c] = first;
    pending_[c].set_request_id(id_);
    pending_[c].set_choice_index(static_cast<uint32_t>(c));
    pending_[c].set_first_output_index(static_cast<uint32_t>(next_index_[c]));
    has_pending_[c] = true;
    next_index_[c] += first.token_ids_size();
    completion_tokens_ += first.token_ids_size();
    if (first.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      --choices_left_;
      continue;
    }
    ResumePoint point;
    if (static_cast<size_t>(c) < before.size()) point.generated = before[c].generated;
    point.generated.insert(point.generated.end(), first.token_ids().begin(),
                           first.token_ids().end());
    auto state = c < ready_.sampler_states_size()
                     ? SamplerStateFromProto(ready_.sampler_states(c))
                     : absl::StatusOr<SamplerState>(absl::InvalidArgumentError("missing"));
    if (!state.ok() || point.generated.empty()) {
      error_ = absl::InternalError(
          absl::StrCat("the prefill worker's first token of choice ", c, " cannot be resumed"));
      break;
    }
    point.sampler_state = *std::move(state);
    point.held_text = ready_.sampler_states(c).stop_string_tail();
    point.choice = c;
    r.resume.push_back(std::move(point));
  }
  if (!first_token_ && handoff_source_.empty()) {
    first_token_ = true;
    service_->metrics().Ttft(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  if (!error_.ok() || r.resume.empty()) {
    // Every choice ended with its first token (or the answer cannot be resumed): done here.
    kv_->Abandon();
    phase_ = Phase::kEnded;
    return true;
  }
  r.role = EngineRole::kDecodeOnly;
  r.window_floor = static_cast<int64_t>(ready_.window_floor());
  r.approximate_kv = ready_.approximate_kv();
  KvReservation blocks = kv_->Take();
  service_->RemoveIncoming(transfer_id_);
  r.imported_blocks = std::move(blocks.blocks);
  if (service_->engine().window_pool() != nullptr) {
    r.imported_window_blocks = std::move(blocks.window_blocks);
  }
  decode_request_ = std::move(r);
  return false;
}

void GenerateCall::StartDecode() {
  // Submitted before the first tokens leave: a client that drains the worker once it sees them
  // finds the request in the engine, where it is parked with its KV (pumped first, a drain
  // between the two ended the request before the engine had it, and its KV was not handed off).
  std::vector<BlockId> imported, imported_window;
  absl::Status submitted;
  {
    absl::MutexLock lock(&mu_);
    EngineRequest r = std::move(decode_request_);
    // Submitted under mu_: an abort from here on finds the request in the engine.
    imported = r.imported_blocks;
    imported_window = r.imported_window_blocks;
    submitted = cause_ != AbortCause::kNone
                    ? absl::CancelledError("aborted before the decode started")
                    : service_->engine().engine().Submit(std::move(r));
    if (submitted.ok()) phase_ = Phase::kSubmitted;
  }
  Pump();  // the first tokens leave now
  if (submitted.ok()) return;
  {
    absl::MutexLock lock(&mu_);
    // Refused, or aborted while starting: the blocks are still ours, and P is done with them.
    std::vector<BlockId> held;
    for (BlockId b : imported) held.push_back(b);
    CHECK_OK(service_->engine().pool().Release(held));
    if (service_->engine().window_pool() != nullptr) {
      held.clear();
      for (BlockId b : imported_window) {
        if (b != kNoBlock) held.push_back(b);
      }
      CHECK_OK(service_->engine().window_pool()->Release(held));
    }
    if (cause_ == AbortCause::kNone) error_ = submitted;
    phase_ = Phase::kEnded;
  }
  Done();
}

void GenerateCall::ClearKvDeadline() {
  if (kv_deadline_ == absl::InfiniteFuture()) return;
  service_->deadlines().Remove(id_ + WorkerService::kKvDeadlineSuffix, kv_deadline_);
  kv_deadline_ = absl::InfiniteFuture();
}

void GenerateCall::EndBeforeEngine(AbortCause cause, absl::Status error) {
  phase_ = Phase::kEnded;
  ClearKvDeadline();
  if (cause_ == AbortCause::kNone) cause_ = cause;
  if (error_.ok()) error_ = std::move(error);
  if (kv_ != nullptr) kv_->Abandon();
  mu_.Unlock();
  Done();
}

namespace {

// Set while a call handles an engine event (on the engine thread): chunks it queues on its token
// stream leave with the engine pass's flush (TokenStreams::FlushAll), not one by one.
thread_local bool in_engine_event = false;

}  // namespace

void GenerateCall::OnEngineEvent(const TokenEvent& e) {
  in_engine_event = true;
  OnEngineEventInPass(e);
  in_engine_event = false;
}

void GenerateCall::OnEngineEventInPass(const TokenEvent& e) {
  bool done = false, failed = false;
  if (e.finish == FinishReason::kHandoff) {
    // Parked by the drain: the KV waits for the worker continuing the request (its stream ends
    // naming this one). The engine holds the blocks until the service releases them.
    ParkedKv parked;
    parked.blocks = e.blocks;
    parked.window_blocks = e.window_blocks;
    parked.window_floor = e.window_floor;
    parked.approximate_kv = e.approximate_kv;
    {
      absl::MutexLock lock(&mu_);
      parked.generated = next_index_[0];
      parked.positions = prompt_tokens_ + parked.generated - 1;
      SamplerStateToProto(e.sampler_state, seed_, 0, e.held_text, &parked.sampler_state);
      parked_ = true;
      if (cause_ == AbortCause::kNone) cause_ = AbortCause::kDrained;
      done = --choices_left_ == 0;
    }
    service_->AddParked(id_, std::move(parked));
    if (done) {
      Done();
    } else {
      Pump();
    }
    return;
  }
  if (e.finish == FinishReason::kAbort && e.choice == 0) {
    absl::MutexLock lock(&mu_);
    if (park_requested_ && cause_ == AbortCause::kDrained) {
      service_->metrics().Handoff("not_parked");  // still not parkable when the drain ended it
    }
  }
  {
    absl::MutexLock lock(&mu_);
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
    store_tokens_ = std::max(store_tokens_, e.imported_tokens);
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
    Done();
  } else {
    Pump();
  }
}

void GenerateCall::Done() {
  {
    RequestOutcome outcome = RequestOutcome::kCompleted;
    {
      absl::MutexLock lock(&mu_);
      outcome = OutcomeOf(cause_, error_.ok());
      if (refused_ && cause_ == AbortCause::kNone) {
        outcome = error_.code() == absl::StatusCode::kInvalidArgument ||
                          error_.code() == absl::StatusCode::kAlreadyExists
                      ? RequestOutcome::kInvalid
                      : RequestOutcome::kRejected;
      }
      if (first_token_) {
        if (service_->role() == "decode") {
          // The prompt was computed (or reused) by the prefill worker, which counts it.
          service_->metrics().DecodeLocalTokens(decode_local_tokens_);
        } else {
          service_->metrics().PromptTokens(prompt_tokens_ - cached_tokens_,
                                           cached_tokens_ - store_tokens_, store_tokens_);
        }
      }
    }
    service_->metrics().Outcome(outcome);
    if (deadline_ != absl::InfiniteFuture()) service_->deadlines().Remove(id_, deadline_);
    service_->Unregister(id_);
    absl::MutexLock lock(&mu_);
    engine_done_ = true;
  }
  Pump();
  Unref();
}

void GenerateCall::Pump() {
  absl::ReleasableMutexLock lock(&mu_);
  if (writing_ || finished_) return;
  if (broken_ || cause_ == AbortCause::kCancelled) {
    // Nobody reads any more: finish once the engine let go of the request.
    if (engine_done_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
    }
    return;
  }
  if (reservation_ready_) {
    reservation_ready_ = false;
    out_.Clear();
    *out_.mutable_reservation() = reservation_;
    writing_ = true;
    lock.Release();
    StartWrite(&out_);
    return;
  }
  if (plan_ready_) {
    plan_ready_ = false;
    out_.Clear();
    out_.mutable_handoff_planned()->set_deadline_unix_ms(absl::ToUnixMillis(plan_deadline_));
    writing_ = true;
    lock.Release();
    StartWrite(&out_);
    return;
  }
  const size_t n = pending_.size();
  if (stream_ != nullptr) {
    // The chunks leave on the token stream (TakeChunks); the closing message waits for them.
    const bool any =
        std::find(has_pending_.begin(), has_pending_.end(), true) != has_pending_.end();
    if (dirty_ || any) {  // (a lost stream set broken_: the call finishes above)
      if (dirty_) return;
      dirty_ = true;
      lock.Release();
      if (!stream_->MarkDirty(this)) return StreamLost();
      if (!in_engine_event) stream_->Flush();
      return;
    }
  }
  for (size_t k = 0; k < n && stream_ == nullptr; ++k) {
    const size_t c = (next_choice_ + k) % n;
    if (!has_pending_[c]) continue;
    next_choice_ = c + 1;
    out_.Clear();
    out_.mutable_tokens()->Swap(&pending_[c]);
    has_pending_[c] = false;
    writing_ = true;
    lock.Release();
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
    final_status = absl::UnavailableError(
        parked_ ? "the worker drained: the request continues elsewhere with its KV"
                : "the worker drained before the request finished");
    retryable = true;
  } else if (!error_.ok()) {
    final_status = error_;
    retryable = error_.code() == absl::StatusCode::kResourceExhausted ||
                error_.code() == absl::StatusCode::kUnavailable;
  }
  finished_ = true;
  out_.Clear();
  if (stream_ != nullptr) out_.set_multiplexed_chunks(multiplexed_chunks_);
  if (final_status.ok()) {
    v1::Usage* usage = out_.mutable_usage();
    usage->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens_));
    usage->set_completion_tokens(static_cast<uint32_t>(completion_tokens_));
    usage->set_cached_tokens(static_cast<uint32_t>(cached_tokens_));
    v1::CachedTokens* by_source = usage->mutable_cached_by_source();
    by_source->set_local(static_cast<uint32_t>(cached_tokens_ - store_tokens_));
    by_source->set_store(static_cast<uint32_t>(store_tokens_));
    by_source->set_decode_local(static_cast<uint32_t>(decode_local_tokens_));
  } else {
    ErrorInfoFromStatus(final_status, trace_id_, retryable, out_.mutable_error());
    if (parked_) out_.mutable_error()->set_handoff_endpoint(service_->endpoint());
    if (kv_refused_) {
      out_.mutable_error()->set_kv_blocks_needed(static_cast<uint64_t>(reservation_blocks_));
    }
  }
  // The closing message and the status in one write, which the caller reads in one wakeup (no
  // OnWriteDone follows; out_ stays untouched until OnDone, as nothing writes once finished_).
  lock.Release();
  StartWriteAndFinish(&out_, grpc::WriteOptions(), ToGrpcStatus(final_status));
}

void GenerateCall::OnWriteDone(bool ok) {
  bool abort = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      broken_ = true;
      abort = !engine_done_;
    }
  }
  if (abort) AbortFor(AbortCause::kCancelled);
  Pump();
}

void GenerateCall::OnCancel() {
  fetch_cancel_.Cancel();  // a fetch of the request's embeddings stops at once
  bool abort = false;
  {
    absl::MutexLock lock(&mu_);
    broken_ = true;
    abort = !engine_done_ && refs_.load() > 1;
  }
  if (abort) AbortFor(AbortCause::kCancelled);
  Pump();
}

void GenerateCall::OnDone() { Unref(); }

bool GenerateCall::TakeChunks(v1::TokenBatch* batch) {
  absl::MutexLock lock(&mu_);
  dirty_ = false;
  v1::TaggedChunks* entry = nullptr;
  for (size_t c = 0; c < pending_.size(); ++c) {
    if (!has_pending_[c]) continue;
    if (entry == nullptr) {
      entry = batch->add_calls();
      entry->set_tag(tag_);
    }
    v1::TokenChunk* chunk = entry->add_chunks();
    chunk->Swap(&pending_[c]);
    chunk->clear_request_id();
    has_pending_[c] = false;
    ++multiplexed_chunks_;
  }
  return engine_done_;
}

void GenerateCall::PumpAfterFlush() { Pump(); }

void GenerateCall::StreamLost() {
  // The chunks cannot reach the caller (whose reader broke too, and which moves the request):
  // the request ends here, as when the caller went away.
  bool abort = false;
  {
    absl::MutexLock lock(&mu_);
    dirty_ = false;
    broken_ = true;
    abort = !engine_done_;
  }
  if (abort) AbortFor(AbortCause::kCancelled);
  Pump();
}

void GenerateCall::Ref() { refs_.fetch_add(1); }

void GenerateCall::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

}  // namespace ferry
