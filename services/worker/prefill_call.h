// One Prefill call on a prefill worker (worker.proto): the request's prompt is computed as a
// prefill-only engine request (its cached prefix taken from this worker's cache), every
// choice's first token sampled, and the KV the decode worker lacks pushed straight from this
// worker's blocks into the decode worker's reservation (KvHandoff's PushTransfers: one put per
// pool, no staging copy). Then KvReady tells the decode worker, and the call answers with the
// first tokens, usage and timings.
//
// Failures: a reservation from a worker whose model, block size or KV layout differs ->
// FAILED_PRECONDITION saying which, before any compute. A push that fails (the decode worker
// died, its deadline passed) -> the handoff is released, the decode worker is told (best
// effort) and the call ends UNAVAILABLE. The caller cancels -> the engine request is aborted
// at its next step (or the push cancelled), the decode worker is told, CANCELLED.
//
// Lifetime: created by WorkerService::Prefill; deletes itself when gRPC is done with it and the
// engine, the transport and the KvReady call have all let go of it.
//
// Thread-safe: engine events on the engine thread, pushes on the service's push executor and
// the transport's threads, gRPC callbacks on its threads; state under mu_.

#ifndef FERRY_SERVICES_WORKER_PREFILL_CALL_H_
#define FERRY_SERVICES_WORKER_PREFILL_CALL_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "ferry/v1/worker.grpc.pb.h"

namespace ferry {

class WorkerService;
enum class AbortCause;

class PrefillCall final : public grpc::ServerUnaryReactor {
 public:
  PrefillCall(WorkerService* service, grpc::CallbackServerContext* context,
              const ferry::v1::PrefillRequest* request, ferry::v1::PrefillResponse* response);
  ~PrefillCall() override;

  // Ends the request early (Abort call, drain deadline, caller gone).
  void AbortFor(AbortCause cause);
  void Ref();
  void Unref();

 private:
  void Start(const ferry::v1::PrefillRequest& request);
  void OnEngineEvent(const TokenEvent& event);
  // On the push executor: connect, hold (test seam), post the puts.
  void Push();
  void OnPushed(const absl::Status& status);
  // Tells the decode worker (KvReady, with `error` unless OK), then answers.
  void NotifyDecode(const absl::Status& error, bool no_transfer);
  void End(const grpc::Status& status);
  // A refused request: tells its decode worker that nothing will be pushed (best effort; the
  // decode worker's quarantine covers a notice that never arrives).
  void TellDecodeNoTransfer(const ferry::v1::PrefillRequest& request, const absl::Status& why);
  void OnCancel() override;
  void OnDone() override;

  WorkerService* const service_;
  grpc::CallbackServerContext* const context_;
  ferry::v1::PrefillResponse* const response_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<int> refs_{1};  // gRPC's; + the engine's, the pushes', KvReady's

  std::mutex mu_;
  std::string id_, trace_id_, decode_endpoint_;
  ferry::v1::KvReservation destination_;
  absl::Time deadline_ = absl::InfiniteFuture();
  bool logprobs_ = false;
  uint64_t seed_ = 0;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0;
  std::vector<ferry::v1::TokenChunk> first_;  // per choice
  std::vector<ferry::v1::SamplerState> states_;
  int32_t choices_left_ = 0;
  bool handed_off_ = false;
  std::vector<BlockId> blocks_, window_blocks_;
  std::chrono::steady_clock::time_point submitted_, computed_, pushed_;
  absl::Duration queued_;            // in the engine's queue (TokenEvent::queued)
  std::vector<uint64_t> transfers_;  // posted, for Cancel
  int pushes_left_ = 0;
  absl::Status push_status_;
  uint64_t bytes_ = 0;
  AbortCause cause_;
  absl::Status error_;
  bool engine_done_ = false, pushing_ = false, ended_ = false;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_PREFILL_CALL_H_
