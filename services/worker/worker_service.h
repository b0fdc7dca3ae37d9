// ferry.v1.Worker (proto/ferry/v1/worker.proto) in the aggregated role: Generate (prefill and
// decode here), Abort, Drain and Watch over one WorkerEngine. Prefill and KvReady belong to the
// disaggregated roles and answer UNIMPLEMENTED here.
//
// Calls are gRPC callback reactors: no thread is held per stream. A Generate call (GenerateCall)
// submits to the engine and streams what the engine thread delivers; a Watch call is one
// subscriber of the WatchHub. Every call checks the shared token first, when one is configured.
//
// Draining (the Drain call, or SIGTERM through Worker): no new Generate is admitted (UNAVAILABLE,
// retryable), running requests go on until the drain deadline, and what is still running then
// ends with an UNAVAILABLE, retryable error (its tokens so far were streamed, so a router can
// resume it elsewhere). The drain state is DRAINING while requests run, DRAINED after.
//
// Thread-safe. The engine, metrics and load window must outlive the service; destroy the gRPC
// server (which waits for every reactor) before the service.

#ifndef FERRY_SERVICES_WORKER_WORKER_SERVICE_H_
#define FERRY_SERVICES_WORKER_WORKER_SERVICE_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "services/worker/deadline_queue.h"
#include "services/worker/load_window.h"
#include "services/worker/watch_hub.h"
#include "services/worker/worker_engine.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_wire.h"

namespace ferry {

class GenerateCall;

// Why a request ended before its choices did.
enum class AbortCause { kNone, kAbortCall, kCancelled, kDeadline, kDrained };

struct WorkerServiceOptions {
  std::string auth_token;  // "": no check
  absl::Duration default_drain_grace = absl::Seconds(30);
  WatchHubOptions watch;
  // Called once when draining starts (the worker drops readiness).
  std::function<void()> on_draining;
};

class WorkerService final : public ferry::v1::Worker::CallbackService {
 public:
  WorkerService(WorkerEngine* engine, WorkerMetrics* metrics, LoadWindow* load,
                WorkerServiceOptions options);
  ~WorkerService() override;

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const ferry::v1::PrefillRequest* request,
                                    ferry::v1::PrefillResponse* response) override;
  grpc::ServerWriteReactor<ferry::v1::GenerateEvent>* Generate(
      grpc::CallbackServerContext* context, const ferry::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* KvReady(grpc::CallbackServerContext* context,
                                    const ferry::v1::KvReadyRequest* request,
                                    ferry::v1::KvReadyResponse* response) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const ferry::v1::AbortRequest* request,
                                  ferry::v1::AbortResponse* response) override;
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context,
                                  const ferry::v1::DrainRequest* request,
                                  ferry::v1::DrainResponse* response) override;
  grpc::ServerWriteReactor<ferry::v1::WorkerStatus>* Watch(
      grpc::CallbackServerContext* context, const ferry::v1::WatchRequest* request) override;

  // Starts the Watch streams' hub once the server's address is known (Watch answers UNAVAILABLE
  // before); `worker_id` "" means the endpoint. Once.
  void StartWatch(const std::string& worker_id, const std::string& endpoint);

  // Stops admitting; requests still running at `deadline` end as drained. Idempotent (an
  // earlier deadline wins).
  void BeginDrain(absl::Time deadline);
  // Waits until no Generate call is left, or `deadline`; true when none is.
  bool WaitIdle(absl::Time deadline);
  // Ends every Watch stream at once (shutdown).
  void CloseWatches();
  ferry::v1::DrainState drain_state() const;
  int64_t live_calls() const;

 private:
  friend class GenerateCall;

  // For GenerateCall.
  WorkerEngine& engine() { return *engine_; }
  WorkerMetrics& metrics() { return *metrics_; }
  const WireLimits& limits() const { return limits_; }
  // Checks the shared token; counts refusals.
  grpc::Status Authorize(const grpc::CallbackServerContext& context);
  bool draining() const;
  // Registers a call under its request id; false when one is live already.
  bool Register(const std::string& id, GenerateCall* call);
  void Unregister(const std::string& id);
  DeadlineQueue& deadlines() { return deadlines_; }
  // Ends the live request `id` (the call learns why); false when none is.
  bool AbortRequest(const std::string& id, AbortCause cause);
  void DrainLoop();

  WorkerEngine* const engine_;
  WorkerMetrics* const metrics_;
  const WorkerServiceOptions options_;
  LoadWindow* const load_;
  WireLimits limits_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  absl::flat_hash_map<std::string, GenerateCall*> calls_;
  bool draining_ = false;
  absl::Time drain_deadline_ = absl::InfiniteFuture();
  bool stopping_ = false;
  std::thread drainer_;
  std::unique_ptr<WatchHub> hub_;  // set once by StartWatch, under mu_

  DeadlineQueue deadlines_;  // last: its thread calls AbortRequest
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WORKER_SERVICE_H_
