#include "services/worker/worker_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "engine/common/model_fingerprint.h"
#include "services/common/shared_token.h"
#include "services/worker/generate_call.h"

namespace ferry {

namespace v1 = ferry::v1;

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

WorkerService::WorkerService(WorkerEngine* engine, WorkerMetrics* metrics, LoadWindow* load,
                             WorkerServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      options_(std::move(options)),
      load_(load),
      deadlines_([this](const std::string& id) { AbortRequest(id, AbortCause::kDeadline); }) {
  const ForwardModel& model = engine_->model();
  limits_.model_fingerprint = model.fingerprint();
  limits_.block_tokens = engine_->engine().block_tokens();
  limits_.max_positions = model.max_positions();
  limits_.vocab_size = model.config().vocab_size;
}

void WorkerService::StartWatch(const std::string& worker_id, const std::string& endpoint) {
  const ForwardModel& model = engine_->model();
  v1::WorkerStatus identity;
  identity.set_worker_id(worker_id.empty() ? endpoint : worker_id);
  identity.set_role(v1::WORKER_ROLE_AGGREGATED);
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
  identity.set_load_window_seconds(static_cast<float>(load_->window_seconds()));
  auto hub = std::make_unique<WatchHub>(
      &engine_->engine(), load_, metrics_, std::move(identity), [this] { return drain_state(); },
      options_.watch);
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(hub_ == nullptr) << "StartWatch twice";
  hub_ = std::move(hub);
}

WorkerService::~WorkerService() {
  CloseWatches();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (drainer_.joinable()) drainer_.join();
}

grpc::Status WorkerService::Authorize(const grpc::CallbackServerContext& context) {
  grpc::Status status = CheckSharedToken(context, options_.auth_token);
  if (!status.ok()) metrics_->Unauthenticated();
  return status;
}

bool WorkerService::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

bool WorkerService::Register(const std::string& id, GenerateCall* call) {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_.emplace(id, call).second;
}

void WorkerService::Unregister(const std::string& id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.erase(id);
  }
  changed_.notify_all();
}

bool WorkerService::AbortRequest(const std::string& id, AbortCause cause) {
  std::lock_guard<std::mutex> lock(mu_);  // held: the call cannot unregister and go meanwhile
  auto it = calls_.find(id);
  if (it == calls_.end()) return false;
  it->second->AbortFor(cause);
  return true;
}

int64_t WorkerService::live_calls() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(calls_.size());
}

v1::DrainState WorkerService::drain_state() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!draining_) return v1::DRAIN_STATE_SERVING;
  return calls_.empty() ? v1::DRAIN_STATE_DRAINED : v1::DRAIN_STATE_DRAINING;
}

void WorkerService::BeginDrain(absl::Time deadline) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = !draining_;
    draining_ = true;
    drain_deadline_ = std::min(drain_deadline_, deadline);
    if (first) drainer_ = std::thread([this] { DrainLoop(); });
  }
  changed_.notify_all();
  if (first) {
    LOG(INFO) << "draining: no new requests; " << live_calls() << " running may finish until "
              << deadline;
    if (options_.on_draining) options_.on_draining();
  }
}

void WorkerService::DrainLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_ && !calls_.empty() && absl::Now() < drain_deadline_) {
    changed_.wait_for(lock, absl::ToChronoNanoseconds(
                                std::max(absl::Milliseconds(1), drain_deadline_ - absl::Now())));
  }
  if (stopping_ || calls_.empty()) return;
  LOG(INFO) << "draining: the deadline passed; ending " << calls_.size() << " request(s)";
  for (auto& [id, call] : calls_) call->AbortFor(AbortCause::kDrained);
}

bool WorkerService::WaitIdle(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!calls_.empty() && absl::Now() < deadline) {
    changed_.wait_for(
        lock, absl::ToChronoNanoseconds(std::max(absl::Milliseconds(1), deadline - absl::Now())));
  }
  return calls_.empty();
}

void WorkerService::CloseWatches() {
  WatchHub* hub = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hub = hub_.get();
  }
  if (hub != nullptr) hub->Shutdown();
}

grpc::ServerUnaryReactor* WorkerService::Prefill(grpc::CallbackServerContext* context,
                                                 const v1::PrefillRequest*, v1::PrefillResponse*) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return Answer(context, auth);
  return Answer(context, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                      "this worker runs the aggregated role; Prefill is served by "
                                      "prefill workers"));
}

grpc::ServerUnaryReactor* WorkerService::KvReady(grpc::CallbackServerContext* context,
                                                 const v1::KvReadyRequest*, v1::KvReadyResponse*) {
  if (grpc::Status auth = Authorize(*context); !auth.ok()) return Answer(context, auth);
  return Answer(context, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                      "this worker runs the aggregated role; KvReady is served by "
                                      "decode workers"));
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
  if (!request->handoff_endpoints().empty()) {
    return Answer(context, grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                                        "handing running requests to other decode workers is "
                                        "not supported by the aggregated worker"));
  }
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
    std::lock_guard<std::mutex> lock(mu_);
    hub = hub_.get();
  }
  if (hub == nullptr) {
    return new Refused(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is starting"));
  }
  return hub->Subscribe(context, request);
}

}  // namespace ferry
