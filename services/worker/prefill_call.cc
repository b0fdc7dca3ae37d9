#include "services/worker/prefill_call.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"
#include "services/common/shared_token.h"
#include "services/worker/kv_handoff.h"
#include "services/worker/worker_service.h"
#include "services/worker/worker_wire.h"

namespace ferry {

namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

uint64_t Micros(std::chrono::steady_clock::duration d) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::microseconds>(d).count()));
}

}  // namespace

PrefillCall::PrefillCall(WorkerService* service, grpc::CallbackServerContext* context,
                         const v1::PrefillRequest* request, v1::PrefillResponse* response)
    : service_(service),
      context_(context),
      response_(response),
      start_(std::chrono::steady_clock::now()),
      cause_(AbortCause::kNone) {
  service_->CallCreated();
  if ((!HasImageBytes(request->request()) && !HasImageHandles(request->request())) ||
      !service_->encodes_images()) {
    Start(*request);
    return;
  }
  // As GenerateCall: image bytes are encoded on the image executor, off the gRPC thread.
  Ref();
  const bool queued = service_->AddImageWork([this, request] {
    const bool cancelled = context_->IsCancelled();
    if (cancelled) {
      service_->metrics().Outcome(RequestOutcome::kCancelled);
      absl::MutexLock lock(&mu_);
      ended_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the caller went away"));
    } else {
      Start(*request);
    }
    Unref();
    return !cancelled;
  });
  if (!queued) {
    Unref();
    image_queue_full_ = true;
    Start(*request);  // refuses it (RESOURCE_EXHAUSTED), telling the decode worker
  }
}

PrefillCall::~PrefillCall() { service_->CallGone(); }

void PrefillCall::Start(const v1::PrefillRequest& request) {
  bool authorized = false;
  auto reject = [&](const grpc::Status& status, bool invalid) {
    // The decode worker may reuse its reservation at once: nothing will be pushed into it.
    if (authorized && !request.decode_endpoint().empty() &&
        !request.destination().transfer().transfer_id().empty()) {
      TellDecodeNoTransfer(request, absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                                                 status.error_message()));
    }
    // CANCELLED before the engine: the caller left while the request's embeddings were fetched.
    service_->metrics().Outcome(status.error_code() == grpc::StatusCode::CANCELLED
                                    ? RequestOutcome::kCancelled
                                : invalid ? RequestOutcome::kInvalid
                                          : RequestOutcome::kRejected);
    absl::MutexLock lock(&mu_);
    ended_ = true;
    Finish(status);
  };
  if (grpc::Status auth = service_->Authorize(*context_); !auth.ok()) return reject(auth, false);
  authorized = true;
  if (service_->role() != "prefill") {
    return reject(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               absl::StrCat("this worker runs the ", service_->role(),
                                            " role; Prefill goes to prefill workers")),
                  true);
  }
  if (service_->draining()) {
    return reject(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the worker is draining: it admits no new requests"),
                  false);
  }
  if (image_queue_full_) {
    return reject(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                               "the worker's image encoding queue is full"),
                  false);
  }
  // Embeddings held by an encoder are fetched first (Start runs on the image executor then).
  FetchedImages fetched;
  if (absl::Status s =
          service_->FetchImages(*context_, request.request(), &fetch_cancel_, &fetched);
      !s.ok()) {
    LOG(WARNING) << LogTraceId(request.request().context().trace_id()) << "request "
                 << request.request().context().request_id() << ": " << s;
    return reject(ToGrpcStatus(s), s.code() == absl::StatusCode::kInvalidArgument ||
                                       s.code() == absl::StatusCode::kFailedPrecondition);
  }
  std::vector<int64_t> first_index;
  absl::StatusOr<EngineRequest> converted =
      ToEngineRequest(request.request(), service_->limits(), &first_index, &fetched);
  if (!converted.ok()) return reject(ToGrpcStatus(converted.status()), true);
  EngineRequest r = *std::move(converted);
  // A migrated request: the prompt and the output so far are computed, and its next token is
  // sampled, here; the decode worker continues from it. One choice at a time (several choices
  // have KV of their own).
  if (!r.resume.empty() && r.n != 1) {
    return reject(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                               "resuming a disaggregated request with several choices is not "
                               "supported"),
                  true);
  }
  const int64_t positions =
      static_cast<int64_t>(r.prompt.size()) +
      (r.resume.empty() ? 0 : static_cast<int64_t>(r.resume[0].generated.size()));
  if (request.decode_endpoint().empty()) {
    return reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "decode_endpoint is empty"),
                  true);
  }
  const int64_t table = service_->engine().pool().layout().BlocksFor(positions);
  if (absl::Status s = CheckReservation(request.destination(), service_->kv_facts(), table);
      !s.ok()) {
    LOG(WARNING) << LogTraceId(request.request().context().trace_id()) << "prefill " << r.id
                 << " refused: " << s;
    return reject(ToGrpcStatus(s), true);
  }
  const v1::RequestContext& ctx = request.request().context();
  {
    absl::MutexLock lock(&mu_);
    id_ = r.id;
    trace_id_ = ctx.trace_id().empty() ? TraceIdOf(*context_) : ctx.trace_id();
    decode_endpoint_ = request.decode_endpoint();
    destination_ = request.destination();
    logprobs_ = r.sampling.top_logprobs >= 0;
    seed_ = r.sampling.seed;
    prompt_tokens_ = static_cast<int64_t>(r.prompt.size());
    kv_positions_ = positions;
    first_.resize(r.n);
    states_.resize(r.n);
    for (int32_t c = 0; c < r.n; ++c) {
      first_[c].set_request_id(id_);
      first_[c].set_choice_index(static_cast<uint32_t>(c));
      first_[c].set_first_output_index(static_cast<uint32_t>(first_index[c]));
    }
    choices_left_ = r.n;
    stream_ = service_->options().stream_kv;
    table_blocks_ = table;
    streamed_to_ = destination_.cached_prefix_blocks();
    if (ctx.deadline_unix_ms() > 0) deadline_ = absl::FromUnixMillis(ctx.deadline_unix_ms());
    if (destination_.deadline_unix_ms() > 0) {
      deadline_ = std::min(deadline_, absl::FromUnixMillis(destination_.deadline_unix_ms()));
    }
  }
  if (!service_->RegisterPrefill(id_, this)) {
    return reject(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                               absl::StrCat("request ", id_, " is already running here")),
                  true);
  }
  if (deadline_ != absl::InfiniteFuture()) service_->deadlines().Add(id_, deadline_);
  r.role = EngineRole::kPrefillOnly;
  r.stream_kv = stream_;
  r.on_event = [this](const TokenEvent& e) { OnEngineEvent(e); };
  service_->WriteComputedBlocks(r, ctx);
  refs_.fetch_add(1);  // the engine's
  if (StoreReader* reader = service_->store_reader(); reader != nullptr) {
    reader->Read(
        std::move(r), deadline_,
        [this](EngineRequest read, const StoreRead& what) {
          {
            absl::MutexLock lock(&mu_);
            store_read_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                std::chrono::duration<double>(what.seconds));
            store_bytes_read_ = what.bytes;
          }
          Submit(std::move(read));
        },
        StoreHintFromProto(request.request()));
    return;
  }
  Submit(std::move(r));
}

void PrefillCall::Submit(EngineRequest r) {
  std::vector<BlockId> imports = r.imported_blocks;
  absl::Status submitted;
  {
    // Under mu_: an abort from here on finds the request in the engine.
    absl::MutexLock lock(&mu_);
    if (cause_ != AbortCause::kNone) {
      submitted = cause_ == AbortCause::kDeadline
                      ? absl::DeadlineExceededError("the request's deadline passed")
                  : cause_ == AbortCause::kDrained
                      ? absl::UnavailableError("the worker drained before the prefill started")
                      : absl::CancelledError("the request was cancelled");
    } else {
      submitted_ = std::chrono::steady_clock::now();
      submitted = service_->engine().engine().Submit(std::move(r));
    }
    if (!submitted.ok()) {
      engine_done_ = true;
      error_ = submitted;
    }
  }
  if (submitted.ok()) return;
  // The engine never had it: the imports are still ours. The decode worker may reuse its
  // reservation at once (nothing was pushed); the call ends once it was told.
  if (!imports.empty()) {
    CHECK_OK(service_->engine().pool().Release(imports));
  }
  NotifyDecode(submitted, /*no_transfer=*/true);
  Unref();  // the engine's
}

void PrefillCall::TellDecodeNoTransfer(const v1::PrefillRequest& request, const absl::Status& why) {
  struct Rpc {
    std::unique_ptr<grpc::ClientContext> context;
    v1::KvReadyRequest request;
    v1::KvReadyResponse response;
  };
  auto rpc = std::make_shared<Rpc>();
  rpc->request.set_request_id(request.destination().request_id());
  rpc->request.set_transfer_id(request.destination().transfer().transfer_id());
  rpc->request.set_no_transfer(true);
  ErrorInfoFromStatus(why, request.request().context().trace_id(), false,
                      rpc->request.mutable_error());
  rpc->context = NewClientContext(service_->options().kv_ready_timeout,
                                  request.request().context().trace_id());
  AttachSharedToken(rpc->context.get(), service_->options().auth_token);
  auto stub = service_->DecodeStub(request.decode_endpoint());
  stub->async()->KvReady(rpc->context.get(), &rpc->request, &rpc->response,
                         [rpc, stub](grpc::Status) {});  // best effort
}

void PrefillCall::AbortFor(AbortCause cause) {
  bool abort_engine = false;
  std::vector<uint64_t> cancel;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    if (cause_ == AbortCause::kNone) cause_ = cause;
    abort_engine = !engine_done_;
    if (pushing_) cancel = transfers_;
  }
  if (abort_engine) service_->engine().engine().Abort(id_);
  for (uint64_t t : cancel) service_->transport()->Cancel(t);
}

void PrefillCall::OnEngineEvent(const TokenEvent& e) {
  if (!e.has_token && e.text.empty() && e.finish == FinishReason::kNone) {
    if (!e.blocks.empty()) OnKvProgress(e.blocks);
    return;
  }
  bool done = false;
  {
    absl::MutexLock lock(&mu_);
    const size_t c = static_cast<size_t>(e.choice);
    if (e.has_token || !e.text.empty() || e.finish != FinishReason::kNone) {
      AppendToChunk(e, logprobs_, &first_[c]);
    }
    cached_tokens_ = std::max(cached_tokens_, e.cached_tokens);
    store_tokens_ = std::max(store_tokens_, e.imported_tokens);
    window_floor_ = std::max(window_floor_, e.window_floor);
    approximate_kv_ = approximate_kv_ || e.approximate_kv;
    queued_ = std::max(queued_, e.queued);
    if (e.finish != FinishReason::kNone) {
      SamplerStateToProto(e.sampler_state, seed_, static_cast<uint32_t>(c), e.held_text,
                          &states_[c]);
      if (e.finish == FinishReason::kHandoff && !handed_off_) {
        handed_off_ = true;
        blocks_ = e.blocks;
        window_blocks_ = e.window_blocks;
      } else if (e.finish == FinishReason::kError && error_.ok()) {
        error_ = absl::Status(
            e.error_code == absl::StatusCode::kOk ? absl::StatusCode::kInternal : e.error_code,
            e.error.empty() ? "the engine failed the request" : e.error);
      } else if (e.finish == FinishReason::kAbort && error_.ok()) {
        error_ = cause_ == AbortCause::kDeadline
                     ? absl::DeadlineExceededError("the request's deadline passed")
                 : cause_ == AbortCause::kDrained
                     ? absl::UnavailableError("the worker drained before the prefill finished")
                     : absl::CancelledError("the request was cancelled");
      }
      done = --choices_left_ == 0;
    }
    if (done) {
      engine_done_ = true;
      computed_ = std::chrono::steady_clock::now();
      if (error_.ok() && handed_off_) pushing_ = true;
    }
  }
  if (!done) return;
  absl::Status error;
  bool push = false, handed_off = false;
  {
    absl::MutexLock lock(&mu_);
    error = error_;
    push = pushing_;
    handed_off = handed_off_;
  }
  if (push) {
    // The first tokens go to the decode worker now, while the KV is pushed: the push's own
    // notifications (the transfer ids') say when it landed, so the decode starts at once then.
    SendFirstTokens();
    refs_.fetch_add(1);  // the push's
    AfterChunks([this] {
      if (service_->AddPush([this] { Push(); })) return;
      service_->engine().engine().ReleaseHandoff(id_);
      bool uncertain = false;
      {
        absl::MutexLock lock(&mu_);
        uncertain = uncertain_;
      }
      PushEnded(absl::UnavailableError("the prefill worker's push queue is full"), !uncertain);
      Unref();  // the push's
    });
  } else {
    // Nothing handed off: an error, or every choice ended with its first token. The decode
    // worker may reuse its blocks at once unless a streamed put failed on its way.
    if (handed_off) service_->engine().engine().ReleaseHandoff(id_);
    AfterChunks([this, error] {
      bool uncertain = false;
      {
        absl::MutexLock lock(&mu_);
        uncertain = uncertain_;
      }
      NotifyDecode(error, /*no_transfer=*/!uncertain);
    });
  }
  Unref();  // the engine's
}

void PrefillCall::OnKvProgress(const std::vector<BlockId>& blocks) {
  int64_t first = 0;
  std::vector<BlockId> chunk;
  {
    absl::MutexLock lock(&mu_);
    if (!stream_ || cause_ != AbortCause::kNone || !chunk_status_.ok()) return;
    // The last block always goes with the transfer ids (the engine never reports it complete
    // before the last chunk; this keeps it so whatever the table).
    const int64_t end = std::min<int64_t>(static_cast<int64_t>(blocks.size()), table_blocks_ - 1);
    if (end <= streamed_to_) return;
    first = streamed_to_;
    chunk.assign(blocks.begin() + first, blocks.begin() + end);
    streamed_to_ = end;
    ++chunks_;
  }
  // The blocks are the running request's; this reference keeps them from reuse (a preemption,
  // an abort) until the put is over.
  absl::Status held = service_->engine().pool().AddRef(chunk);
  refs_.fetch_add(1);  // the chunk's
  if (held.ok() && service_->AddPush([this, first, chunk] { PushChunk(first, chunk); })) return;
  if (held.ok()) {
    CHECK_OK(service_->engine().pool().Release(chunk));
  }
  {
    // Not streamed after all: the final puts take these blocks (nothing waits on chunks_ yet:
    // the engine has not finished the request).
    absl::MutexLock lock(&mu_);
    streamed_to_ = first;
    --chunks_;
  }
  if (!held.ok())
    LOG(ERROR) << LogTraceId(trace_id_) << "request " << id_
               << ": cannot hold blocks to stream: " << held;
  Unref();  // the chunk's
}

void PrefillCall::PushChunk(int64_t first, std::vector<BlockId> blocks) {
  HoldForTest();
  absl::Status failed;
  {
    absl::MutexLock lock(&mu_);
    if (cause_ != AbortCause::kNone) failed = absl::CancelledError("the request was cancelled");
    if (!chunk_status_.ok()) failed = chunk_status_;
  }
  transfer::TransferRequest put;
  std::shared_ptr<KvHostBlocks> source;  // the put's bytes, until it is over
  uint64_t bytes = 0;
  if (failed.ok()) {
    auto built = StreamTransfer(destination_, first, blocks, *service_->engine().staging(),
                                deadline_, &bytes, &source);
    if (built.ok()) {
      put = *std::move(built);
    } else {
      failed = built.status();
    }
  }
  if (failed.ok()) {
    auto peer = Peer();
    if (peer.ok()) {
      put.peer = *peer;
    } else {
      failed = peer.status();
    }
  }
  if (!failed.ok()) return OnChunkPushed(failed, blocks, 0, /*posted=*/false);
  // Streamed blocks are whole blocks of the prompt.
  const int64_t tokens =
      static_cast<int64_t>(blocks.size()) * service_->engine().pool().layout().block_tokens;
  auto posted =
      PostOnWire(std::move(put), tokens, [this, blocks, bytes, source](absl::Status s) mutable {
        source.reset();  // its staging slots go back
        OnChunkPushed(s, blocks, bytes, /*posted=*/true);
      });
  if (!posted.ok()) OnChunkPushed(posted.status(), blocks, 0, /*posted=*/false);
}

void PrefillCall::OnChunkPushed(const absl::Status& status, const std::vector<BlockId>& blocks,
                                uint64_t bytes, bool posted) {
  // The transport no longer touches the blocks.
  CHECK_OK(service_->engine().pool().Release(blocks));
  std::function<void()> then;
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      streamed_bytes_ += bytes;
    } else {
      if (chunk_status_.ok()) chunk_status_ = status;
      if (posted) uncertain_ = true;
    }
    if (--chunks_ == 0 && after_chunks_) {
      then = std::move(after_chunks_);
      after_chunks_ = nullptr;
    }
  }
  if (then) then();
  Unref();  // the chunk's
}

void PrefillCall::AfterChunks(std::function<void()> then) {
  {
    absl::MutexLock lock(&mu_);
    if (chunks_ > 0) {
      refs_.fetch_add(1);  // the wait's
      after_chunks_ = [this, then = std::move(then)] {
        then();
        Unref();  // the wait's
      };
      return;
    }
  }
  then();
}

absl::StatusOr<uint64_t> PrefillCall::Peer() {
  if (connected_) return peer_;
  auto connected = service_->transport()->Connect(destination_.transfer().worker_address());
  if (!connected.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot reach the decode worker's KV transport: ",
                                               connected.status().message()));
  }
  peer_ = *connected;
  connected_ = true;
  return peer_;
}

absl::StatusOr<uint64_t> PrefillCall::PostOnWire(transfer::TransferRequest put, int64_t tokens,
                                                 std::function<void(absl::Status)> done) {
  auto wire = [this](int delta) {
    absl::MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    if (delta > 0 && on_wire_++ == 0) wire_since_ = now;
    if (delta < 0 && --on_wire_ == 0) wire_ += now - wire_since_;
  };
  std::function<void(absl::Status)> finish = [wire, done = std::move(done)](absl::Status s) {
    wire(-1);
    done(std::move(s));
  };
  SimLink* link = tokens > 0 ? service_->sim_link() : nullptr;
  const absl::Time deadline = put.deadline;
  // With the simulated link: `finish` once both the transport and the link are done (the first
  // failure wins). Neither callback blocks: the link's runs on its own thread.
  struct Join {
    absl::Mutex mu;
    int left ABSL_GUARDED_BY(mu) = 2;
    absl::Status status ABSL_GUARDED_BY(mu);
    std::function<void(absl::Status)> finish ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Join> join;
  if (link != nullptr) {
    join = std::make_shared<Join>();
    {
      absl::MutexLock lock(&join->mu);
      join->finish = std::move(finish);
    }
    finish = [join](absl::Status s) {
      std::function<void(absl::Status)> then;
      absl::Status status;
      {
        absl::MutexLock lock(&join->mu);
        if (!s.ok() && join->status.ok()) join->status = std::move(s);
        if (--join->left > 0) return;
        then = std::move(join->finish);
        status = join->status;
      }
      then(status);
    };
  }
  wire(+1);  // before Post: the put may complete before it returns
  auto posted = service_->transport()->Post(std::move(put), finish);
  if (!posted.ok()) {
    wire(-1);
    return posted;
  }
  if (link != nullptr) {
    link->Start(service_->engine().sim_timing()->KvBytes(tokens), deadline, [finish](bool served) {
      finish(served ? absl::OkStatus()
                    : absl::DeadlineExceededError(
                          "the simulated link did not carry the KV by the deadline"));
    });
  }
  return posted;
}

void PrefillCall::HoldForTest() {
  // Test seam: hold the put while the file exists (bounded by the deadline; a cancel ends it).
  const std::string& hold = service_->options().push_hold_file;
  if (hold.empty()) return;
  if (access(hold.c_str(), F_OK) == 0) {
    LOG(INFO) << "request " << id_ << ": test seam: holding the prefill push while " << hold
              << " exists";
  }
  while (access(hold.c_str(), F_OK) == 0 && absl::Now() < deadline_ + absl::Seconds(1)) {
    {
      absl::MutexLock lock(&mu_);
      if (cause_ != AbortCause::kNone) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void PrefillCall::Push() {
  HoldForTest();
  absl::Status failed;
  std::vector<transfer::TransferRequest> puts;
  bool cancelled = false, uncertain = false;
  int64_t from = 0;
  std::vector<BlockId> blocks, window_blocks;
  int64_t window_floor = 0;
  {
    // Every streamed put is over (AfterChunks).
    absl::MutexLock lock(&mu_);
    cancelled = cause_ != AbortCause::kNone;
    if (cancelled) failed = absl::CancelledError("the request was cancelled");
    if (failed.ok() && !chunk_status_.ok()) failed = chunk_status_;
    uncertain = uncertain_;
    from = streamed_to_;
    blocks = blocks_;
    window_blocks = window_blocks_;
    window_floor = window_floor_;
  }
  std::vector<std::shared_ptr<KvHostBlocks>> sources;  // each put's bytes, until it is over
  if (failed.ok()) {
    uint64_t bytes = 0;
    auto built = PushTransfers(destination_, blocks, window_blocks, *service_->engine().staging(),
                               service_->engine().window_staging(), from, window_floor, deadline_,
                               &bytes, &sources);
    if (!built.ok()) {
      failed = built.status();
    } else {
      puts = *std::move(built);
      absl::MutexLock lock(&mu_);
      bytes_ = streamed_bytes_ + bytes;
    }
  }
  transfer::PeerId peer = 0;
  if (failed.ok()) {
    auto connected = Peer();
    if (!connected.ok()) {
      failed = connected.status();
    } else {
      peer = *connected;
    }
  }
  if (!failed.ok()) {
    // No put naming the transfer ids was posted: the decode worker may reuse its blocks at once,
    // unless a streamed put failed (its bytes may still land; the transport's word decides).
    service_->engine().engine().ReleaseHandoff(id_);
    service_->metrics().Push(0, 0, 0, 0, false);
    PushEnded(cancelled
                  ? failed
                  : absl::UnavailableError(absl::StrCat("the KV push failed: ", failed.message())),
              /*no_transfer=*/!uncertain);
    Unref();  // the push's
    return;
  }
  service_->metrics().BlocksSkipped(destination_.cached_prefix_blocks());
  {
    absl::MutexLock lock(&mu_);
    pushes_left_ = static_cast<int>(puts.size());
  }
  // One reference per put; the push's own is held until the loop is done (a put may complete,
  // and the call end, before Post returns).
  refs_.fetch_add(static_cast<int>(puts.size()));
  // The positions the first put (the pool's blocks) carries: the prompt from the first block
  // not streamed and not held by the decode worker. (A window pool's put: a hybrid model, never
  // the simulated engine's.)
  const int64_t pushed_from = std::max<int64_t>(destination_.cached_prefix_blocks(), from) *
                              service_->engine().pool().layout().block_tokens;
  int64_t tokens = std::max<int64_t>(0, kv_positions_ - pushed_from);
  for (size_t i = 0; i < puts.size(); ++i) {
    transfer::TransferRequest& put = puts[i];
    put.peer = peer;
    auto posted =
        PostOnWire(std::move(put), tokens, [this, source = sources[i]](absl::Status s) mutable {
          source.reset();  // its staging slots go back
          OnPushed(s);
        });
    tokens = 0;
    if (!posted.ok()) {
      OnPushed(posted.status());
    } else {
      absl::MutexLock lock(&mu_);
      transfers_.push_back(*posted);
    }
  }
  Unref();  // the push's
}

void PrefillCall::OnPushed(const absl::Status& status) {
  bool last = false;
  absl::Status outcome;
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && push_status_.ok()) push_status_ = status;
    last = --pushes_left_ == 0;
    if (last) {
      pushing_ = false;
      pushed_ = std::chrono::steady_clock::now();
      outcome = push_status_;
    }
  }
  if (last) {
    // The transport no longer touches the blocks.
    service_->engine().engine().ReleaseHandoff(id_);
    std::chrono::steady_clock::duration wire, tail;
    uint64_t bytes = 0, streamed = 0;
    {
      absl::MutexLock lock(&mu_);
      wire = wire_;
      tail = pushed_ - computed_;
      bytes = bytes_;
      streamed = streamed_bytes_;
    }
    service_->metrics().Push(bytes, streamed, Seconds(wire), Seconds(tail), outcome.ok());
    if (!outcome.ok()) {
      LOG(WARNING) << LogTraceId(trace_id_) << "request " << id_ << ": the KV push to "
                   << decode_endpoint_ << " failed: " << outcome;
      outcome = outcome.code() == absl::StatusCode::kCancelled
                    ? outcome
                    : absl::UnavailableError(absl::StrCat("the KV push to the decode worker "
                                                          "failed: ",
                                                          outcome.message()));
    }
    PushEnded(outcome, /*no_transfer=*/false);
  }
  Unref();  // this put's
}

void PrefillCall::PushEnded(const absl::Status& outcome, bool no_transfer) {
  if (!outcome.ok()) {
    // The decode worker stops waiting now (not at its deadline): a put naming the transfer ids
    // may not have been posted, so no notification may come. (no_transfer false: a put's bytes
    // may still be on their way; its blocks wait for the transport's word, or the quarantine.)
    TellDecodeFailed(outcome, no_transfer);
  }
  {
    absl::MutexLock lock(&mu_);
    push_done_ = true;
    push_outcome_ = outcome;
  }
  Settle();
}

void PrefillCall::CallKvReady(
    const absl::Status& error, bool no_transfer,
    std::function<void(const grpc::Status&, const v1::KvReadyRequest&)> done) {
  struct Rpc {
    std::unique_ptr<grpc::ClientContext> context;
    v1::KvReadyRequest request;
    v1::KvReadyResponse response;
  };
  auto rpc = std::make_shared<Rpc>();
  FillReady(error, no_transfer, &rpc->request);
  rpc->context = NewClientContext(service_->options().kv_ready_timeout, trace_id_);
  AttachSharedToken(rpc->context.get(), service_->options().auth_token);
  auto stub = service_->DecodeStub(decode_endpoint_);
  refs_.fetch_add(1);  // the KvReady call's
  stub->async()->KvReady(rpc->context.get(), &rpc->request, &rpc->response,
                         [this, rpc, stub, done = std::move(done)](grpc::Status status) {
                           done(status, rpc->request);
                           Unref();
                         });
}

void PrefillCall::SendFirstTokens() {
  CallKvReady(absl::OkStatus(), /*no_transfer=*/false,
              [this](const grpc::Status& status, const v1::KvReadyRequest& sent) {
                {
                  absl::MutexLock lock(&mu_);
                  ready_done_ = true;
                  ready_status_ = status;
                  usage_ = sent.usage();
                }
                Settle();
              });
}

void PrefillCall::TellDecodeFailed(const absl::Status& error, bool no_transfer) {
  CallKvReady(error, no_transfer,
              [](const grpc::Status&, const v1::KvReadyRequest&) {});  // best effort
}

void PrefillCall::Settle() {
  grpc::Status end;
  {
    absl::MutexLock lock(&mu_);
    if (!ready_done_ || !push_done_ || settled_) return;
    settled_ = true;
    if (!push_outcome_.ok()) {
      end = ToGrpcStatus(push_outcome_);
    } else if (!ready_status_.ok()) {
      end = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         absl::StrCat("the decode worker did not take the first tokens: ",
                                      ready_status_.error_message()));
    } else {
      FillResponseLocked();
    }
  }
  End(end);
}

void PrefillCall::FillReady(const absl::Status& error, bool no_transfer,
                            v1::KvReadyRequest* request) {
  absl::MutexLock lock(&mu_);
  request->set_request_id(id_);
  request->set_transfer_id(destination_.transfer().transfer_id());
  request->set_no_transfer(no_transfer);
  if (!error.ok()) {
    ErrorInfoFromStatus(error, trace_id_, error.code() != absl::StatusCode::kCancelled,
                        request->mutable_error());
  } else {
    for (const v1::TokenChunk& chunk : first_) *request->add_first_tokens() = chunk;
    for (const v1::SamplerState& state : states_) *request->add_sampler_states() = state;
  }
  v1::Usage* usage = request->mutable_usage();
  usage->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens_));
  usage->set_cached_tokens(static_cast<uint32_t>(cached_tokens_));
  usage->mutable_cached_by_source()->set_local(
      static_cast<uint32_t>(cached_tokens_ - store_tokens_));
  usage->mutable_cached_by_source()->set_store(static_cast<uint32_t>(store_tokens_));
  request->set_window_floor(static_cast<uint64_t>(window_floor_));
  request->set_approximate_kv(approximate_kv_);
}

void PrefillCall::FillResponseLocked() {
  response_->set_request_id(id_);
  for (const v1::TokenChunk& chunk : first_) *response_->add_first_tokens() = chunk;
  *response_->mutable_usage() = usage_;
  const auto queued = std::chrono::microseconds(absl::ToInt64Microseconds(queued_));
  response_->set_queue_us(Micros(queued));
  response_->set_compute_us(Micros(computed_ - submitted_ - queued));
  response_->set_transfer_us(Micros(pushed_ - computed_));
  response_->set_bytes_transferred(bytes_);
  response_->set_bytes_streamed(streamed_bytes_);
  response_->set_wire_us(Micros(wire_));
  response_->set_blocks_skipped(destination_.cached_prefix_blocks());
  response_->set_store_read_us(Micros(store_read_));
  response_->set_store_bytes_read(static_cast<uint64_t>(store_bytes_read_));
}

void PrefillCall::NotifyDecode(const absl::Status& error, bool no_transfer) {
  CallKvReady(error, no_transfer,
              [this, error](const grpc::Status& status, const v1::KvReadyRequest& sent) {
                if (!error.ok()) {
                  End(ToGrpcStatus(error));
                } else if (!status.ok()) {
                  End(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   absl::StrCat("the decode worker did not take the KV: ",
                                                status.error_message())));
                } else {
                  {
                    absl::MutexLock lock(&mu_);
                    usage_ = sent.usage();
                    FillResponseLocked();
                  }
                  End(grpc::Status::OK);
                }
              });
}

void PrefillCall::End(const grpc::Status& status) {
  RequestOutcome outcome = RequestOutcome::kCompleted;
  {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    ended_ = true;
    outcome = OutcomeOf(cause_, status.ok());
    if (status.ok()) {
      service_->metrics().PromptTokens(prompt_tokens_ - cached_tokens_,
                                       cached_tokens_ - store_tokens_, store_tokens_);
    }
  }
  service_->metrics().Outcome(outcome);
  if (deadline_ != absl::InfiniteFuture()) service_->deadlines().Remove(id_, deadline_);
  service_->UnregisterPrefill(id_);
  Finish(status);
}

void PrefillCall::OnCancel() {
  fetch_cancel_.Cancel();  // a fetch of the request's embeddings stops at once
  AbortFor(AbortCause::kCancelled);
}

void PrefillCall::OnDone() { Unref(); }

void PrefillCall::Ref() { refs_.fetch_add(1); }

void PrefillCall::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

}  // namespace ferry
