#include "services/worker/worker_service.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "engine/common/model_fingerprint.h"
#include "kvstore/wire.h"
#include "services/common/grpc_client.h"
#include "services/common/shared_token.h"
#include "services/worker/generate_call.h"
#include "services/worker/prefill_call.h"

namespace ferry {

namespace {

grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// A Watch reactor that only finishes.
class Refused final : public grpc::ServerWriteReactor<v1::WorkerStatus> {
 public:
  explicit Refused(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

RequestOutcome OutcomeOf(AbortCause cause, bool ok) {
  switch (cause) {
    case AbortCause::kAbortCall:
      return RequestOutcome::kAborted;
    case AbortCause::kCancelled:
      return RequestOutcome::kCancelled;
    case AbortCause::kDeadline:
      return RequestOutcome::kDeadlineExceeded;
    case AbortCause::kDrained:
      return RequestOutcome::kDrained;
    case AbortCause::kNone:
      break;
  }
  return ok ? RequestOutcome::kCompleted : RequestOutcome::kError;
}

void WorkerService::WriteComputedBlocks(EngineRequest& request, const v1::RequestContext& context) {
  StoreWriter* writer = options_.store_writer;
  if (writer == nullptr) return;
  const kv::TrafficClass c = kv::ClassFromProto(context.traffic_class());
  const uint32_t floor = context.retention_floor_seconds();
  // Blocks [0, prompt_blocks) hold prompt tokens only; the floor is for those.
  const int64_t prompt_blocks =
      static_cast<int64_t>(request.prompt.size()) / std::max<int64_t>(limits_.block_tokens, 1);
  request.on_computed_blocks = [writer, c, floor,
                                prompt_blocks](absl::Span<const ComputedBlock> blocks) {
    if (floor == 0) {  // every block alike
      writer->Offer(blocks, c);
      return;
    }
    std::vector<ComputedBlock> prompt, output;
    for (const ComputedBlock& b : blocks) (b.index < prompt_blocks ? prompt : output).push_back(b);
    if (!prompt.empty()) writer->Offer(prompt, c, floor);
    if (!output.empty()) writer->Offer(output, c);
  };
}

WorkerService::WorkerService(WorkerEngine* engine, WorkerMetrics* metrics, LoadWindow* load,
                             WorkerServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      options_(std::move(options)),
      load_(load),
      constraints_(options_.constraints),
      deadlines_([this](const std::string& id) {
        if (absl::EndsWith(id, kKvDeadlineSuffix)) {
          KvDeadline(id.substr(0, id.size() - std::strlen(kKvDeadlineSuffix)));
        } else {
          AbortRequest(id, AbortCause::kDeadline);
        }
      }) {
  const ForwardModel& model = engine_->model();
  limits_.model_fingerprint = model.fingerprint();
  limits_.block_tokens = engine_->engine().block_tokens();
  limits_.max_positions = model.max_positions();
  limits_.vocab_size = model.config().vocab_size;
  limits_.hidden_size = model.config().hidden_size;
  limits_.image_encoder = engine_->image_encoder();
  limits_.compile_constraint = [this](const Hash128& hash, absl::string_view gbnf,
                                      absl::Span<const TokenId> kept_special) {
    return CompileConstraint(hash, gbnf, kept_special);
  };
  if (limits_.image_encoder != nullptr) {
    images_ = std::make_unique<SerialExecutor>(options_.max_queued_image_requests);
    EmbeddingFetcherOptions fetch;
    fetch.auth_token = options_.auth_token;
    fetch.max_fetch_time = options_.max_image_fetch_time;
    fetcher_ = std::make_unique<EmbeddingFetcher>(std::move(fetch), limits_,
                                                  limits_.image_encoder->vision_digest(), metrics_);
  }
  facts_ = KvFactsOf(engine_->engine(), engine_->pool(), engine_->window_pool());
  if (options_.transport != nullptr) {
    target_.transport = options_.transport;
    target_.staging = engine_->staging();
    CHECK(target_.staging != nullptr) << "a worker with a KV transport has no KV staging";
    auto region = engine_->RegionOf(*target_.staging);
    CHECK_OK(region.status());
    target_.pool_region = region->descriptor;
    if (engine_->window_pool() != nullptr) {
      target_.window_staging = engine_->window_staging();
      CHECK(target_.window_staging != nullptr);
      auto window = engine_->RegionOf(*target_.window_staging);
      CHECK_OK(window.status());
      target_.window_region = window->descriptor;
    }
  }
  if (options_.role == "prefill") {
    pushes_ = std::make_unique<SerialExecutor>(options_.max_queued_pushes);
  }
}

void WorkerService::StartWatch(const std::string& worker_id, const std::string& endpoint) {
  const ForwardModel& model = engine_->model();
  v1::WorkerStatus identity;
  identity.set_worker_id(worker_id.empty() ? endpoint : worker_id);
  identity.set_role(options_.role == "prefill"  ? v1::WORKER_ROLE_PREFILL
                    : options_.role == "decode" ? v1::WORKER_ROLE_DECODE
                                                : v1::WORKER_ROLE_AGGREGATED);
  identity.mutable_model()->set_name(engine_->model_name());
  identity.mutable_model()->mutable_fingerprint()->set_lo(model.fingerprint().lo);
  identity.mutable_model()->mutable_fingerprint()->set_hi(model.fingerprint().hi);
  identity.set_protocol_version(v1::PROTOCOL_VERSION_1);
  identity.set_kv_format_version(kKvFormatVersion);
  const EngineOptions& eo = engine_->engine_options();
  v1::WorkerCapacity* capacity = identity.mutable_capacity();
  capacity->set_max_running_requests(static_cast<uint32_t>(eo.max_running));
  capacity->set_max_batch_tokens(static_cast<uint32_t>(eo.max_batch_tokens));
  capacity->set_total_kv_blocks(static_cast<uint64_t>(engine_->engine().stats().total_blocks));
  capacity->set_block_tokens(static_cast<uint32_t>(limits_.block_tokens));
  capacity->set_max_context_tokens(static_cast<uint32_t>(model.max_positions()));
  capacity->set_max_queued_requests(static_cast<uint32_t>(eo.max_queued));
  capacity->set_max_choices(static_cast<uint32_t>(eo.max_n));
  capacity->set_max_window(static_cast<uint32_t>(model.max_window()));
  identity.set_endpoint(endpoint);
  identity.set_incarnation(absl::ToUnixNanos(absl::Now()) ^
                           (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(this)) << 16));
  identity.set_engine(engine_->engine_kind());
  v1::BackendInfo* backend = identity.mutable_backend();
  backend->set_kind(engine_->backend_kind());
  backend->set_device(engine_->backend().name());
  const Backend::MemoryReport memory = engine_->backend().memory();
  backend->set_memory_limit_bytes(memory.limit_bytes);
  backend->set_device_memory_bytes(memory.device_bytes);
  identity.set_load_window_seconds(static_cast<float>(load_->window_seconds()));
  auto hub = std::make_unique<WatchHub>(
      &engine_->engine(), load_, metrics_, std::move(identity), [this] { return drain_state(); },
      options_.watch);
  absl::MutexLock lock(&mu_);
  CHECK(hub_ == nullptr) << "StartWatch twice";
  hub_ = std::move(hub);
  endpoint_ = endpoint;
}

WorkerService::~WorkerService() {
  StopPushes();
  CloseWatches();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    changed_.SignalAll();
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (call_objects_ != 0 && !changed_.WaitWithDeadline(&mu_, give_up)) {
    }
    if (call_objects_ != 0) {
      LOG(ERROR) << call_objects_ << " call(s) still alive at shutdown";
    }
  }
  if (drainer_.joinable()) drainer_.join();
}

void WorkerService::StopPushes() {
  std::unique_ptr<SerialExecutor> pushes;
  {
    absl::MutexLock lock(&mu_);
    pushes_stopped_ = true;
    pushes = std::move(pushes_);
  }
  pushes.reset();  // runs what is queued, then joins
}

absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> WorkerService::CompileConstraint(
    const Hash128& hash, absl::string_view gbnf, absl::Span<const TokenId> kept_special) {
  absl::StatusOr<std::shared_ptr<const grammar::TokenTrie>> vocabulary =
      engine_->engine().Vocabulary(kept_special);
  if (!vocabulary.ok()) {
    metrics_->GrammarLookup("error", 0, constraints_.bytes());
    return absl::InvalidArgumentError(
        absl::StrCat("this worker cannot constrain outputs: ", vocabulary.status().message()));
  }
  grammar::ConstraintLookup lookup;
  absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> compiled =
      constraints_.Get(hash, gbnf, *std::move(vocabulary), &lookup);
  const char* result = lookup.result == grammar::ConstraintLookup::Result::kHit    ? "hit"
                       : lookup.result == grammar::ConstraintLookup::Result::kMiss ? "miss"
                                                                                   : "error";
  metrics_->GrammarLookup(result, lookup.compile_seconds, constraints_.bytes());
  return compiled;
}

bool WorkerService::AddImageWork(std::function<bool()> task) {
  if (images_ == nullptr) return false;
  metrics_->ImageWaiting(+1);
  const bool queued = images_->Add([this, task = std::move(task)] {
    metrics_->ImageWaiting(-1);
    metrics_->ImageEncoding(+1);
    HoldImagesForTest();
    const absl::Time start = absl::Now();
    const bool encoded = task();
    metrics_->ImageEncoding(-1);
    metrics_->ImageRequest(encoded ? "encoded" : "cancelled",
                           absl::ToDoubleSeconds(absl::Now() - start));
  });
  if (!queued) {
    metrics_->ImageWaiting(-1);
    metrics_->ImageRequest("rejected");
    LOG(WARNING) << "image encoding queue full (" << options_.max_queued_image_requests
                 << " requests): refused";
  }
  return queued;
}

absl::Status WorkerService::FetchImages(const grpc::CallbackServerContext& context,
                                        const v1::TokenizedRequest& request, FetchCancel* cancel,
                                        FetchedImages* fetched) {
  if (fetcher_ == nullptr || !HasImageHandles(request)) return absl::OkStatus();
  absl::Time call_deadline = absl::InfiniteFuture();
  // gRPC's "no deadline" is the clock's maximum, which absl's conversion would saturate anyway.
  if (context.deadline() < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    call_deadline = absl::FromChrono(context.deadline());
  }
  return fetcher_->Fetch(request, call_deadline, cancel, fetched);
}

void WorkerService::HoldImagesForTest() {
  const std::string& hold = options_.image_hold_file;
  if (hold.empty() || access(hold.c_str(), F_OK) != 0) return;
  LOG(INFO) << "test seam: image encoding waits while " << hold << " exists";
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (access(hold.c_str(), F_OK) == 0 && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool WorkerService::AddPush(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (pushes_stopped_ || pushes_ == nullptr) return false;
  return pushes_->Add(std::move(task));
}

void WorkerService::CallCreated() {
  absl::MutexLock lock(&mu_);
  ++call_objects_;
}

void WorkerService::CallGone() {
  {
    absl::MutexLock lock(&mu_);
    --call_objects_;
  }
  changed_.SignalAll();
}

grpc::Status WorkerService::Authorize(const grpc::CallbackServerContext& context) {
  grpc::Status status = CheckSharedToken(context, options_.auth_token);
  if (!status.ok()) metrics_->Unauthenticated();
  return status;
}

bool WorkerService::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool WorkerService::Register(const std::string& id, GenerateCall* call) {
  absl::MutexLock lock(&mu_);
  return calls_.emplace(id, call).second;
}

void WorkerService::Unregister(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    calls_.erase(id);
  }
  changed_.SignalAll();
}

void WorkerService::AddIncoming(const std::string& transfer_id, std::weak_ptr<IncomingKv> kv) {
  absl::MutexLock lock(&mu_);
  incoming_[transfer_id] = std::move(kv);
}

void WorkerService::RemoveIncoming(const std::string& transfer_id) {
  absl::MutexLock lock(&mu_);
  incoming_.erase(transfer_id);
}

bool WorkerService::RegisterPrefill(const std::string& id, PrefillCall* call) {
  absl::MutexLock lock(&mu_);
  return prefills_.emplace(id, call).second;
}

void WorkerService::UnregisterPrefill(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    prefills_.erase(id);
  }
  changed_.SignalAll();
}

bool WorkerService::AbortRequest(const std::string& id, AbortCause cause) {
  // A reference taken under the lock keeps the call alive; the call is told without the lock
  // (ending it unregisters, which takes the lock).
  GenerateCall* call = nullptr;
  PrefillCall* prefill = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = calls_.find(id); it != calls_.end()) {
      call = it->second;
      call->Ref();
    } else if (auto p = prefills_.find(id); p != prefills_.end()) {
      prefill = p->second;
      prefill->Ref();
    } else {
      return false;
    }
  }
  if (call != nullptr) {
    call->AbortFor(cause);
    call->Unref();
  } else {
    prefill->AbortFor(cause);
    prefill->Unref();
  }
  return true;
}

void WorkerService::KvDeadline(const std::string& id) {
  GenerateCall* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(id);
    if (it == calls_.end()) return;
    call = it->second;
    call->Ref();
  }
  call->OnKvDeadline();
  call->Unref();
}

std::shared_ptr<v1::Worker::Stub> WorkerService::DecodeStub(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  auto it = decode_stubs_.find(endpoint);
  if (it != decode_stubs_.end()) return it->second;
  if (decode_stubs_.size() >= kMaxDecodeChannels) decode_stubs_.erase(decode_stubs_.begin());
  // A decode worker the router named: when it restarts on its address, the first tokens of the
  // next request must reach it at once, not after gRPC's growing reconnect backoff (which would
  // fail every KvReady meanwhile, and each request's retries with them).
  ChannelOptions channel;
  channel.max_reconnect_backoff = absl::Milliseconds(250);
  auto stub = std::shared_ptr<v1::Worker::Stub>(v1::Worker::NewStub(NewChannel(endpoint, channel)));
  decode_stubs_.emplace(endpoint, stub);
  return stub;
}

int64_t WorkerService::live_calls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(calls_.size() + prefills_.size());
}

v1::DrainState WorkerService::drain_state() const {
  absl::MutexLock lock(&mu_);
  if (!draining_) return v1::DRAIN_STATE_SERVING;
  return IdleLocked() ? v1::DRAIN_STATE_DRAINED : v1::DRAIN_STATE_DRAINING;
}

bool WorkerService::IdleLocked() const {
  return calls_.empty() && prefills_.empty() && parked_.empty() && handoff_pushes_ == 0;
}

void WorkerService::BeginDrain(absl::Time deadline) {
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    first = !draining_;
    draining_ = true;
    drain_deadline_ = std::min(drain_deadline_, deadline);
    if (first) {
      drain_started_ = absl::Now();
      drainer_ = std::thread([this] { DrainLoop(); });
    }
  }
  changed_.SignalAll();
  if (first) {
    metrics_->DrainStarted();
    LOG(INFO) << "draining: no new requests; " << live_calls() << " running may finish until "
              << deadline
              << (hands_off() ? ", then they are handed off with their KV" : ", then they end");
    if (options_.on_draining) options_.on_draining();
    if (hands_off()) PlanHandoffs(deadline);
  }
}

void WorkerService::DrainLoop() {
  mu_.Lock();
  auto busy = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !calls_.empty() || !prefills_.empty();
  };
  while (!stopping_ && busy() && absl::Now() < drain_deadline_) {
    changed_.WaitWithTimeout(&mu_, std::max(absl::Milliseconds(1), drain_deadline_ - absl::Now()));
  }
  if (stopping_) {
    mu_.Unlock();
    return;
  }
  if (!calls_.empty()) {
    // Generate calls are parked (or ended); accepted prefills end on their own, once their KV
    // reached the decode worker (their reservation's deadline bounds them).
    std::vector<std::string> ids;
    for (auto& [id, call] : calls_) ids.push_back(id);
    mu_.Unlock();
    LOG(INFO) << "draining: the deadline passed; " << (hands_off() ? "handing off " : "ending ")
              << ids.size() << " request(s)";
    for (const std::string& id : ids) AbortRequest(id, AbortCause::kDrained);
    mu_.Lock();
  }
  // Until nothing is left: parked KV nobody took in time is released, and requests still running
  // handoff_wait after the deadline (never parkable: several choices) end.
  bool ended = false;
  while (!stopping_ && !IdleLocked()) {
    const absl::Time now = absl::Now();
    const absl::Time hard = drain_deadline_ + options_.handoff_wait;
    if (!ended && now >= hard && !calls_.empty()) {
      ended = true;
      std::vector<std::string> ids;
      for (auto& [id, call] : calls_) ids.push_back(id);
      mu_.Unlock();
      LOG(WARNING) << "draining: ending " << ids.size() << " request(s) that could not be handed "
                   << "off within " << options_.handoff_wait << " of the deadline";
      for (const std::string& id : ids) AbortRequest(id, AbortCause::kDrained);
      mu_.Lock();
      continue;
    }
    absl::Time next = std::min(now + absl::Seconds(1), ended ? absl::InfiniteFuture() : hard);
    std::vector<std::string> expired;
    for (auto& [id, parked] : parked_) {
      if (parked.expires <= now) {
        expired.push_back(id);
      } else {
        next = std::min(next, parked.expires);
      }
    }
    for (const std::string& id : expired) {
      parked_.erase(id);
      engine_->engine().ReleaseHandoff(id);
      metrics_->Handoff("expired");
      LOG(WARNING) << "draining: nobody took the KV of request " << id << " within "
                   << options_.handoff_wait << "; it is released (the request resumes by "
                   << "re-prefill)";
    }
    if (!expired.empty()) continue;
    changed_.WaitWithTimeout(&mu_, std::max(absl::Milliseconds(1), next - now));
  }
  if (stopping_) {
    mu_.Unlock();
    return;
  }
  const absl::Duration took = absl::Now() - drain_started_;
  mu_.Unlock();
  metrics_->DrainDuration(absl::ToDoubleSeconds(took));
  LOG(INFO) << "drained in " << took;
  changed_.SignalAll();
  if (options_.on_drained) options_.on_drained();
}

bool WorkerService::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!IdleLocked() && absl::Now() < deadline) {
    changed_.WaitWithTimeout(&mu_, std::max(absl::Milliseconds(1), deadline - absl::Now()));
  }
  return IdleLocked();
}

void WorkerService::AddParked(const std::string& id, ParkedKv parked) {
  {
    absl::MutexLock lock(&mu_);
    parked.expires = absl::Now() + options_.handoff_wait;
    parked_[id] = std::move(parked);
  }
  changed_.SignalAll();
}

std::string WorkerService::endpoint() const {
  absl::MutexLock lock(&mu_);
  return endpoint_;
}

void WorkerService::CloseWatches() {
  WatchHub* hub = nullptr;
  {
    absl::MutexLock lock(&mu_);
    hub = hub_.get();
  }
  if (hub != nullptr) hub->Shutdown();
}

grpc::ServerUnaryReactor* WorkerService::Prefill(grpc::CallbackServerContext* context,
                                                 const v1::PrefillRequest* request,
                                                 v1::PrefillResponse* response) {
  return new PrefillCall(this, context, request, response);
}

grpc::ServerUnaryReactor* WorkerService::KvReady(grpc::CallbackServerContext* context,
                                                 const v1::KvReadyRequest* request,
                                                 v1::KvReadyResponse*) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return Answer(context, auth);
  if (options_.role != "decode") {
    return Answer(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                        absl::StrCat("this worker runs the ", options_.role,
                                                     " role; KvReady goes to decode workers")));
  }
  GenerateCall* call = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(request->request_id());
    if (it != calls_.end()) {
      call = it->second;
      call->Ref();
    }
  }
  if (call == nullptr) {
    std::shared_ptr<IncomingKv> kv;
    {
      absl::MutexLock lock(&mu_);
      auto it = incoming_.find(request->transfer_id());
      if (it != incoming_.end()) kv = it->second.lock();
    }
    if (kv != nullptr && request->no_transfer()) {
      kv->NoTransfer();  // the call ended before this came: its blocks may go now
      return Answer(context, grpc::Status::OK);
    }
    return Answer(context,
                  grpc::Status(grpc::StatusCode::NOT_FOUND,
                               absl::StrCat("no reservation for request ", request->request_id(),
                                            " here (it ended, or never came)")));
  }
  const grpc::Status status = call->OnKvReady(*request);
  call->Unref();
  return Answer(context, status);
}

grpc::ServerWriteReactor<v1::GenerateEvent>* WorkerService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateCall(this, context, request);
}

grpc::ServerUnaryReactor* WorkerService::Abort(grpc::CallbackServerContext* context,
                                               const v1::AbortRequest* request,
                                               v1::AbortResponse* response) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return Answer(context, auth);
  if (request->request_id().empty()) {
    return Answer(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id is empty"));
  }
  bool found = AbortRequest(request->request_id(), AbortCause::kAbortCall);
  if (!found && engine_->engine().IsLive(request->request_id())) {
    engine_->engine().Abort(request->request_id());
    found = true;
  }
  if (found) {
    LOG(INFO) << "abort " << request->request_id()
              << (request->reason().empty() ? "" : absl::StrCat(": ", request->reason()));
  }
  response->set_found(found);
  return Answer(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* WorkerService::Drain(grpc::CallbackServerContext* context,
                                               const v1::DrainRequest* request,
                                               v1::DrainResponse* response) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return Answer(context, auth);
  const absl::Duration grace = request->grace_seconds() > 0
                                   ? absl::Seconds(request->grace_seconds())
                                   : options_.default_drain_grace;
  BeginDrain(absl::Now() + grace);
  response->set_state(drain_state());
  response->set_running_requests(static_cast<uint32_t>(live_calls()));
  return Answer(context, grpc::Status::OK);
}

grpc::ServerWriteReactor<v1::WorkerStatus>* WorkerService::Watch(
    grpc::CallbackServerContext* context, const v1::WatchRequest* request) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return new Refused(auth);
  WatchHub* hub = nullptr;
  {
    absl::MutexLock lock(&mu_);
    hub = hub_.get();
  }
  if (hub == nullptr) {
    return new Refused(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is starting"));
  }
  return hub->Subscribe(context, request);
}

grpc::ServerWriteReactor<v1::TokenBatch>* WorkerService::Tokens(
    grpc::CallbackServerContext* context, const v1::TokenStreamRequest* request) {
  class RefusedStream final : public grpc::ServerWriteReactor<v1::TokenBatch> {
   public:
    explicit RefusedStream(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return new RefusedStream(auth);
  if (options_.token_streams == nullptr) {
    return new RefusedStream(
        grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this worker has no token streams"));
  }
  return options_.token_streams->Open(context, request);
}

grpc::ServerUnaryReactor* WorkerService::PushKv(grpc::CallbackServerContext* context,
                                                const v1::PushKvRequest* request,
                                                v1::PushKvResponse* response) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return Answer(context, auth);
  if (request->precopy()) return PushPrecopy(context, request, response);
  const std::string id = request->request_id();
  ParkedKv parked;
  {
    absl::MutexLock lock(&mu_);
    auto it = parked_.find(id);
    if (it == parked_.end()) {
      return Answer(context, grpc::Status(grpc::StatusCode::NOT_FOUND,
                                          absl::StrCat("no KV of request ", id,
                                                       " waits here for a hand-off (it expired, "
                                                       "was taken, or never was parked)")));
    }
    parked = std::move(it->second);
    parked_.erase(it);
    ++handoff_pushes_;  // until the push's outcome
  }
  const auto start = std::chrono::steady_clock::now();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The push's end, whatever its outcome: the KV goes back, the call answers.
  auto finish = [this, reactor, response, id, start](const absl::Status& outcome, uint64_t bytes) {
    engine_->engine().ReleaseHandoff(id);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (outcome.ok()) {
      metrics_->Handoff("pushed", bytes, seconds);
      response->set_bytes_transferred(bytes);
      response->set_transfer_us(static_cast<uint64_t>(seconds * 1e6));
      LOG(INFO) << "hand-off of request " << id << ": " << bytes << " bytes pushed in "
                << absl::Seconds(seconds);
    } else {
      metrics_->Handoff("failed");
      LOG(WARNING) << "hand-off of request " << id << " failed: " << outcome;
    }
    reactor->Finish(outcome.ok()
                        ? grpc::Status::OK
                        : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                       absl::StrCat("the KV push failed: ", outcome.message())));
    {
      absl::MutexLock lock(&mu_);
      --handoff_pushes_;
    }
    changed_.SignalAll();
  };
  const v1::KvReservation& destination = request->destination();
  absl::Status failed;
  if (request->generated_tokens() != static_cast<uint64_t>(parked.generated)) {
    failed = absl::FailedPreconditionError(
        absl::StrCat("the request continues after ", request->generated_tokens(),
                     " generated tokens; ", parked.generated, " were generated here"));
  }
  const int64_t table = engine_->pool().layout().BlocksFor(parked.positions);
  if (failed.ok()) failed = CheckReservation(destination, facts_, table);
  std::vector<transfer::TransferRequest> puts;
  std::vector<std::shared_ptr<KvHostBlocks>> sources;  // the puts' bytes, until they are done
  uint64_t bytes = 0;
  if (failed.ok()) {
    const absl::Time deadline = std::min(absl::FromUnixMillis(destination.deadline_unix_ms()),
                                         absl::Now() + options_.reservation_timeout);
    auto built =
        PushTransfers(destination, parked.blocks, parked.window_blocks, *engine_->staging(),
                      engine_->window_staging(), destination.cached_prefix_blocks(),
                      parked.window_floor, deadline, &bytes, &sources);
    if (!built.ok()) {
      failed = built.status();
    } else {
      puts = *std::move(built);
    }
  }
  transfer::PeerId peer = 0;
  if (failed.ok()) {
    auto connected = options_.transport->Connect(destination.transfer().worker_address());
    if (!connected.ok()) {
      failed = connected.status();
    } else {
      peer = *connected;
    }
  }
  if (!failed.ok() || puts.empty()) {
    finish(failed.ok() ? absl::FailedPreconditionError("the reservation leaves nothing to push")
                       : failed,
           0);
    return reactor;
  }
  *response->mutable_sampler_state() = parked.sampler_state;
  response->set_window_floor(static_cast<uint64_t>(parked.window_floor));
  response->set_approximate_kv(parked.approximate_kv);
  struct Pending {
    absl::Mutex mu;
    int left ABSL_GUARDED_BY(mu) = 0;
    absl::Status status ABSL_GUARDED_BY(mu);
    std::vector<std::shared_ptr<KvHostBlocks>> sources ABSL_GUARDED_BY(mu);
  };
  auto pending = std::make_shared<Pending>();
  {
    absl::MutexLock lock(&pending->mu);
    pending->left = static_cast<int>(puts.size());
    pending->sources = std::move(sources);
  }
  auto one_done = [pending, finish, bytes](const absl::Status& s) {
    absl::Status outcome;
    std::vector<std::shared_ptr<KvHostBlocks>> sources;
    {
      absl::MutexLock lock(&pending->mu);
      if (!s.ok() && pending->status.ok()) pending->status = s;
      if (--pending->left > 0) return;
      outcome = pending->status;
      sources = std::move(pending->sources);
    }
    sources.clear();  // every put is over: their staging slots go back
    finish(outcome, bytes);
  };
  auto post = [this, id, puts = std::move(puts), peer, one_done]() mutable {
    if (const std::string& hold = options_.push_hold_file; !hold.empty()) {
      // Test seam (as a prefill push's): hold the puts while the file exists. The log line is
      // the tests' event that the push is held.
      if (access(hold.c_str(), F_OK) == 0) {
        LOG(INFO) << "test seam: the hand-off push of request " << id << " waits while " << hold
                  << " exists";
      }
      const absl::Time until = puts.front().deadline + absl::Seconds(1);
      while (access(hold.c_str(), F_OK) == 0 && absl::Now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    for (transfer::TransferRequest& put : puts) {
      put.peer = peer;
      auto posted = options_.transport->Post(std::move(put), one_done);
      if (!posted.ok()) one_done(posted.status());
    }
  };
  if (options_.push_hold_file.empty()) {
    post();
  } else {
    CallCreated();  // the destructor waits for this thread's end
    std::thread([this, post = std::move(post)]() mutable {
      post();
      CallGone();
    }).detach();
  }
  return reactor;
}

}  // namespace ferry
