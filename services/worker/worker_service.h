// ferry.v1.Worker (proto/ferry/v1/worker.proto) over one WorkerEngine, in one of three roles:
//   - aggregated: Generate (prefill and decode here), Abort, Drain, Watch;
//   - decode: Generate without `aggregated` (reserve KV, wait for a prefill worker's push and
//     KvReady, then decode: GenerateCall), KvReady, Abort, Drain, Watch;
//   - prefill: Prefill (compute, push the KV into the decode worker's reservation, KvReady:
//     PrefillCall), Abort, Drain, Watch.
// Calls a role does not serve answer FAILED_PRECONDITION saying where they belong.
//
// Calls are gRPC callback reactors: no thread is held per stream. A Generate call (GenerateCall)
// submits to the engine and streams what the engine thread delivers; a Watch call is one
// subscriber of the WatchHub. Every call checks the shared token first, when one is configured.
//
// Draining (the Drain call, or SIGTERM through Worker): no new Generate or Prefill is admitted
// (UNAVAILABLE, retryable), running requests go on until the drain deadline, and the Watch
// streams stay open saying DRAINING (so that a router sends nothing new but does not take the
// worker for dead). At the deadline (decode and aggregated roles with a KV transport) each
// request between two tokens is parked: the engine stops it with its KV kept, and its stream ends
// UNAVAILABLE, retryable, with ErrorInfo.handoff_endpoint = this worker. The worker that continues
// it (GenerateRequest.handoff_source_endpoint) calls PushKv, and the KV is pushed straight into
// its reservation. Pre-copy: when the drain begins, each such call tells its caller
// (GenerateEvent.handoff_planned), who may pick the target then and call its PrefetchKv; the
// target reserves blocks for the full blocks computed so far and calls PushKv with precopy here,
// which pushes them from the running request; they wait in the target's prefix cache, so the
// hand-off at the deadline pushes only the blocks written since (handoff_precopy.cc). A parked KV
// nobody takes within handoff_wait is released. What cannot be parked (several choices, still
// prefilling) ends UNAVAILABLE, retryable without it: a router resumes it by re-prefill. Prefill
// calls accepted before the drain are not cut: they end once their KV reached the decode worker
// (bounded by their reservation's deadline). The drain state is DRAINING while calls run or KV
// waits, DRAINED after (then on_drained runs once).
//
// Thread-safe. The engine, metrics and load window must outlive the service; destroy the gRPC
// server (which waits for every reactor) before the service.

#ifndef FERRY_SERVICES_WORKER_WORKER_SERVICE_H_
#define FERRY_SERVICES_WORKER_WORKER_SERVICE_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/grammar/constraint_cache.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "services/common/shared_token.h"
#include "services/worker/deadline_queue.h"
#include "services/worker/embedding_fetcher.h"
#include "services/worker/incoming_kv.h"
#include "services/worker/kv_handoff.h"
#include "services/worker/load_window.h"
#include "services/worker/serial_executor.h"
#include "services/worker/sim_link.h"
#include "services/worker/store_reader.h"
#include "services/worker/store_writer.h"
#include "services/worker/token_stream.h"
#include "services/worker/watch_hub.h"
#include "services/worker/worker_engine.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_wire.h"

namespace ferry {

class GenerateCall;
class PrefillCall;

// A request the drain stopped between two tokens with its KV kept (Engine::Park), waiting for the
// worker continuing it to call PushKv.
struct ParkedKv {
  std::vector<BlockId> blocks, window_blocks;  // the engine's handoff (held until released)
  int64_t positions = 0;                       // the KV's: prompt + generated - 1
  int64_t generated = 0;
  ferry::v1::SamplerState sampler_state;  // after the last generated token, with the held tail
  int64_t window_floor = 0;
  bool approximate_kv = false;
  absl::Time expires = absl::InfiniteFuture();
};

// Why a request ended before its choices did.
enum class AbortCause { kNone, kAbortCall, kCancelled, kDeadline, kDrained };
// How a request that ended for `cause` is counted (kNone: completed, or error when !ok).
RequestOutcome OutcomeOf(AbortCause cause, bool ok);

struct WorkerServiceOptions {
  SharedToken auth_token;  // none: no check
  absl::Duration default_drain_grace = absl::Seconds(30);
  WatchHubOptions watch;
  // Called once when draining starts (the worker drops readiness), and once when it is over.
  std::function<void()> on_draining;
  std::function<void()> on_drained;
  // How long a parked request's KV waits for the worker continuing it to call PushKv.
  absl::Duration handoff_wait = absl::Seconds(30);
  // "aggregated", "prefill" or "decode" (WorkerOptions::role).
  std::string role = "aggregated";
  // Prefill and decode: the KV transport the pools are registered with (outlives the service).
  transfer::KvTransport* transport = nullptr;
  absl::Duration reservation_timeout = absl::Seconds(30);
  absl::Duration reservation_quarantine = absl::Seconds(30);
  // Prefill: how long the KvReady call to a decode worker may take.
  absl::Duration kv_ready_timeout = absl::Seconds(10);
  bool stream_kv = true;       // WorkerOptions::stream_kv
  std::string push_hold_file;  // WorkerOptions::push_hold_file
  // Test seam: while this file exists, the image executor waits before each request (at most
  // 60 s each), counted as encoding, so tests can fill its queue without racing it. "": none.
  std::string image_hold_file;
  size_t max_queued_pushes = 4096;
  // Requests with image bytes waiting for the image executor (beyond: RESOURCE_EXHAUSTED).
  size_t max_queued_image_requests = 64;
  // The most a request's fetches of encoder-held embeddings (embeddings_handle) may take, within
  // its own deadline.
  absl::Duration max_image_fetch_time = absl::Seconds(30);
  // The KV store (may be null: none). Prefill and aggregated calls read their prefix through
  // the reader before the engine sees them; every call offers the blocks it computes to the
  // writer. Both outlive the service's calls.
  StoreReader* store_reader = nullptr;
  StoreWriter* store_writer = nullptr;
  // Prefill with the simulated engine (--engine=sim): the link its pushes share; each put
  // completes no earlier than this link carries its simulated bytes (may be null: none).
  // Outlives the service's calls' pushes.
  SimLink* sim_link = nullptr;
  // The token streams (token_stream.h; may be null: Tokens answers UNIMPLEMENTED and every
  // Generate call sends on itself). Outlives the service's calls.
  TokenStreams* token_streams = nullptr;
  // Structured output: the compile cache of requests' constraints (ToEngineRequest compiles them
  // on the calling thread through it; constraint_cache.h).
  grammar::ConstraintCacheOptions constraints;
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
  grpc::ServerUnaryReactor* PushKv(grpc::CallbackServerContext* context,
                                   const ferry::v1::PushKvRequest* request,
                                   ferry::v1::PushKvResponse* response) override;
  grpc::ServerUnaryReactor* PrefetchKv(grpc::CallbackServerContext* context,
                                       const ferry::v1::PrefetchKvRequest* request,
                                       ferry::v1::PrefetchKvResponse* response) override;
  grpc::ServerWriteReactor<ferry::v1::TokenBatch>* Tokens(
      grpc::CallbackServerContext* context, const ferry::v1::TokenStreamRequest* request) override;

  // Starts the Watch streams' hub once the server's address is known (Watch answers UNAVAILABLE
  // before); `worker_id` "" means the endpoint. Once.
  void StartWatch(const std::string& worker_id, const std::string& endpoint);

  // Stops admitting; requests still running at `deadline` end as drained. Idempotent (an
  // earlier deadline wins).
  void BeginDrain(absl::Time deadline);
  // Waits until no call is left and no parked KV waits for its hand-off, or `deadline`; true
  // when none is.
  bool WaitIdle(absl::Time deadline);
  // Ends every Watch stream at once (shutdown).
  void CloseWatches();
  // Shutdown, after the gRPC server stopped and before the transport goes: runs the pushes
  // still queued, then refuses new ones.
  void StopPushes();
  ferry::v1::DrainState drain_state() const;
  int64_t live_calls() const;

 private:
  friend class GenerateCall;
  friend class PrefillCall;

  // For the calls.
  WorkerEngine& engine() { return *engine_; }
  WorkerMetrics& metrics() { return *metrics_; }
  const WireLimits& limits() const { return limits_; }
  const std::string& role() const { return options_.role; }
  const WorkerServiceOptions& options() const { return options_; }
  transfer::KvTransport* transport() { return options_.transport; }
  StoreReader* store_reader() { return options_.store_reader; }
  SimLink* sim_link() { return options_.sim_link; }
  // Sends the full blocks `request` computes to the store's writer (if any), with the request's
  // traffic class (its retention there) and, for the blocks wholly inside its prompt, the
  // context's retention floor (output blocks: the class alone).
  void WriteComputedBlocks(EngineRequest& request, const ferry::v1::RequestContext& context);
  const ReservationTarget& reservation_target() const { return target_; }
  const KvFacts& kv_facts() const { return facts_; }
  absl::Duration reservation_timeout() const { return options_.reservation_timeout; }
  absl::Duration reservation_quarantine() const { return options_.reservation_quarantine; }
  // Whether this worker encodes image bytes (its model has a vision tower), and runs `task`
  // (a call's Start with image bytes to decode and encode) on the image executor: one thread,
  // at most max_queued_image_requests waiting; false when it is full. `task` returns false when
  // it found its caller gone and did nothing (the image metrics count it cancelled).
  bool encodes_images() const { return images_ != nullptr; }
  bool AddImageWork(std::function<bool()> task);
  // On the image executor (a call's Start): fetches the rows of the request's images named by
  // handle from their encoders (embedding_fetcher.h), within the call's deadline; OK with nothing
  // fetched when there are none or this worker has no vision model (ToEngineRequest refuses the
  // handles then). `cancel` is the call's (its OnCancel stops the fetch).
  absl::Status FetchImages(const grpc::CallbackServerContext& context,
                           const ferry::v1::TokenizedRequest& request, FetchCancel* cancel,
                           FetchedImages* fetched);
  // Test seam (image_hold_file): waits while the file exists.
  void HoldImagesForTest();
  // Runs `task` on the push executor; false when it is full or stopped.
  bool AddPush(std::function<void()> task);
  // A stub for the decode worker at `endpoint` (channels are kept, at most kMaxDecodeChannels).
  std::shared_ptr<ferry::v1::Worker::Stub> DecodeStub(const std::string& endpoint);
  // Decode: the reservations whose blocks may still be written, by transfer id, so that a
  // prefill worker's KvReady saying it never pushed releases them even after their call ended.
  void AddIncoming(const std::string& transfer_id, std::weak_ptr<IncomingKv> kv);
  void RemoveIncoming(const std::string& transfer_id);
  bool RegisterPrefill(const std::string& id, PrefillCall* call);
  void UnregisterPrefill(const std::string& id);
  // Every call object counts itself while it exists (it may outlive its RPC while the engine or
  // the transport still holds it): the destructor waits for them.
  void CallCreated();
  void CallGone();
  // Checks the shared token; counts refusals.
  grpc::Status Authorize(const grpc::CallbackServerContext& context);
  bool draining() const;
  // The drain deadline passed and this worker hands requests off with their KV.
  bool hands_off() const { return options_.transport != nullptr && options_.role != "prefill"; }
  // The drain began (handoff_precopy.cc): every Generate call that may be parked tells its caller
  // (GenerateCall::PlanHandoff).
  void PlanHandoffs(absl::Time deadline);
  // PushKv with precopy (handoff_precopy.cc): the running request's first blocks into the
  // target's reservation.
  grpc::ServerUnaryReactor* PushPrecopy(grpc::CallbackServerContext* context,
                                        const ferry::v1::PushKvRequest* request,
                                        ferry::v1::PushKvResponse* response);
  // Holds the request's first `blocks` blocks (at the engine's next step) and puts them into
  // `destination` on peer `to`; `finish` runs once with the outcome and the bytes moved.
  void StartPrecopy(const std::string& id, int64_t blocks,
                    const ferry::v1::KvReservation& destination, transfer::PeerId to,
                    absl::Time deadline, std::function<void(const absl::Status&, uint64_t)> finish);
  // A GenerateCall parked its request (on the engine thread, before its stream ends).
  void AddParked(const std::string& id, ParkedKv parked);
  // "host:port" of this worker's Worker service (StartWatch's endpoint).
  std::string endpoint() const;
  // The open token stream `id` with a reference (Unref it), or null.
  TokenStream* FindTokenStream(const std::string& id) {
    return options_.token_streams != nullptr ? options_.token_streams->Find(id) : nullptr;
  }
  // Registers a call under its request id; false when one is live already.
  bool Register(const std::string& id, GenerateCall* call);
  void Unregister(const std::string& id);
  DeadlineQueue& deadlines() { return deadlines_; }
  // WireLimits::compile_constraint: the grammar for the engine's vocabulary with the request's
  // kept special tokens, through the compile cache, counted in the metrics.
  absl::StatusOr<std::shared_ptr<const grammar::CompiledConstraint>> CompileConstraint(
      const Hash128& hash, absl::string_view gbnf, absl::Span<const TokenId> kept_special);
  // Ends the live request `id` (the call learns why); false when none is.
  bool AbortRequest(const std::string& id, AbortCause cause);
  // The deadline queue's entry for a decode call waiting for its KV: `id` + kKvDeadlineSuffix.
  static constexpr char kKvDeadlineSuffix[] = "#kv";
  void KvDeadline(const std::string& id);
  void DrainLoop();
  // No call left, no parked KV, no hand-off push in flight.
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  static constexpr size_t kMaxDecodeChannels = 256;

  WorkerEngine* const engine_;
  WorkerMetrics* const metrics_;
  const WorkerServiceOptions options_;
  LoadWindow* const load_;
  WireLimits limits_;
  grammar::ConstraintCache constraints_;
  KvFacts facts_;
  ReservationTarget target_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  std::unique_ptr<SerialExecutor> pushes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, GenerateCall*> calls_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PrefillCall*> prefills_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::weak_ptr<IncomingKv>> incoming_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<ferry::v1::Worker::Stub>> decode_stubs_
      ABSL_GUARDED_BY(mu_);
  int64_t call_objects_ ABSL_GUARDED_BY(mu_) = 0;
  bool pushes_stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time drain_started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_map<std::string, ParkedKv> parked_ ABSL_GUARDED_BY(mu_);
  int64_t handoff_pushes_ ABSL_GUARDED_BY(mu_) = 0;  // PushKv calls whose puts are in flight
  std::string endpoint_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread drainer_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<WatchHub> hub_ ABSL_GUARDED_BY(mu_);  // set once by StartWatch
  // With a vision model: fetches encoder-held embeddings (on the image executor's thread, so
  // declared before it: destroyed after it).
  std::unique_ptr<EmbeddingFetcher> fetcher_;
  // With a vision model: where requests with image bytes are encoded (AddImageWork). Destroyed
  // before the state its tasks touch (running what is queued, then joining), after deadlines_'s
  // users are gone.
  std::unique_ptr<SerialExecutor> images_;

  DeadlineQueue deadlines_;  // last: its thread calls AbortRequest
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_WORKER_SERVICE_H_
