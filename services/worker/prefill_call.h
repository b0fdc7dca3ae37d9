// One Prefill call on a prefill worker (worker.proto): the request's prompt is computed as a
// prefill-only engine request (its cached prefix taken from this worker's cache), every
// choice's first token sampled, and the KV the decode worker lacks pushed straight from this
// worker's blocks into the decode worker's reservation (no staging copy). The first tokens go to
// the decode worker (KvReady) as soon as they are sampled, while the KV is pushed: the push's
// last puts carry the reservation's transfer ids, whose notifications are the one signal that
// the KV is complete, so the decode starts the moment the last byte lands. The call answers with
// the first tokens, usage and timings once the push and the KvReady call are both over.
//
// Streaming (stream_kv, the default): while the prompt is computed, the blocks each step
// completes are pushed at once (StreamTransfer: puts without a transfer id, each holding its own
// reference to its blocks), so the first token waits only for the last chunk's KV. Once every
// streamed put has completed OK, the rest of the table (and a hybrid model's window pool) goes in
// the puts that carry the reservation's transfer ids (PushTransfers): the decode worker's
// notification then means every byte is in place. Nothing is told to the decode worker, and no
// final put is posted, while a streamed put is still running. A streamed put that failed ends
// the push; the decode worker is then told to wait for its transport's word before it reuses the
// blocks (no_transfer false), since that put's bytes may still be on their way.
//
// With a KV store: before the compute, the prefix this worker's memory lacks is read from the
// store (StoreReader); those blocks count as cached (Usage.cached_by_source.store) and, being
// complete at the admission, are pushed to the decode worker while the rest is computed. The
// blocks the request computes go to the store's writer. A bounded window replay (hybrid models,
// --swa_replay=bounded) is told to the decode worker (KvReady.window_floor, approximate_kv).
//
// The simulated engine (--engine=sim): each put (streamed or final) completes only once the
// worker's SimLink has also carried the simulated model's KV of its positions, under fair sharing
// with the worker's other pushes, so the decode worker is told no earlier than the modeled
// transfer (SimTiming::TransferSeconds) allows.
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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "services/transfer/kv_transport.h"
#include "services/worker/embedding_fetcher.h"

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
  // Submits the engine request (after the KV store was read, when there is one); a request the
  // engine refuses, or one that ended meanwhile, is told to the decode worker and ends.
  void Submit(EngineRequest request);
  void OnEngineEvent(const TokenEvent& event);
  // On the engine thread (stream_kv): the table's complete blocks so far.
  void OnKvProgress(const std::vector<BlockId>& blocks);
  // On the push executor: one streamed put of table blocks first.. (referenced for it).
  void PushChunk(int64_t first, std::vector<BlockId> blocks);
  void OnChunkPushed(const absl::Status& status, const std::vector<BlockId>& blocks, uint64_t bytes,
                     bool posted);
  // Runs `then` once no streamed put is queued or running: now, or when the last one ends.
  void AfterChunks(std::function<void()> then);
  // Test seam (push_hold_file): waits while the file exists, bounded by the deadline.
  void HoldForTest();
  // On the push executor: the connection to the decode worker's transport, made once.
  absl::StatusOr<uint64_t> Peer();
  // Posts `put`, counting its time on the wire (wire_) until just before `done` runs; a put Post
  // refuses is off the wire again (and `done` never runs). With the simulated engine's link
  // (service sim_link), `done` waits also for the link to carry `tokens` positions' simulated
  // KV, started with the put (an unserved one by the put's deadline fails it).
  absl::StatusOr<uint64_t> PostOnWire(transfer::TransferRequest put, int64_t tokens,
                                      std::function<void(absl::Status)> done);
  // On the push executor: hold (test seam), connect, post the puts that name the transfer ids.
  void Push();
  void OnPushed(const absl::Status& status);
  // Nothing is pushed (an error, or every choice ended with its first token): tells the decode
  // worker (KvReady, with `error` unless OK), then answers.
  void NotifyDecode(const absl::Status& error, bool no_transfer);
  // A push follows: the first tokens go to the decode worker at once (KvReady), while the KV is
  // pushed; the call answers once both the KvReady call and the push are over (Settle).
  void SendFirstTokens();
  // The push is over: on failure the decode worker is told (best effort, TellDecodeFailed).
  void PushEnded(const absl::Status& outcome, bool no_transfer);
  void TellDecodeFailed(const absl::Status& error, bool no_transfer);
  // Calls KvReady on the decode worker with this call's message (FillReady), holding a reference
  // until `done` (status, the message sent) has run on gRPC's callback thread.
  void CallKvReady(const absl::Status& error, bool no_transfer,
                   std::function<void(const grpc::Status&, const ferry::v1::KvReadyRequest&)> done);
  void Settle();
  // The KvReady message of this call (the first tokens, or `error`), and the answer's fields.
  void FillReady(const absl::Status& error, bool no_transfer, ferry::v1::KvReadyRequest* request);
  void FillResponseLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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
  bool image_queue_full_ = false;  // set before Start, which then refuses the request
  FetchCancel fetch_cancel_;       // OnCancel stops the fetch of the request's embeddings
  std::atomic<int> refs_{1};       // gRPC's; + the engine's, the pushes', KvReady's

  absl::Mutex mu_;
  // Set by Start (from the constructor) and never written after: read without the lock.
  std::string id_, trace_id_, decode_endpoint_;
  ferry::v1::KvReservation destination_;
  absl::Time deadline_ = absl::InfiniteFuture();
  bool logprobs_ = false;
  uint64_t seed_ = 0;
  int64_t prompt_tokens_ = 0;
  // The positions whose KV goes to the decode worker: the prompt's, and a migrated request's
  // output so far. (Set by Start.)
  int64_t kv_positions_ = 0;
  int64_t cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t store_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // of cached_tokens_, read from the KV store
  // A bounded window replay (TokenEvent::window_floor, approximate_kv).
  int64_t window_floor_ ABSL_GUARDED_BY(mu_) = 0;
  bool approximate_kv_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::duration store_read_ ABSL_GUARDED_BY(mu_){};
  int64_t store_bytes_read_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ferry::v1::TokenChunk> first_ ABSL_GUARDED_BY(mu_);  // per choice
  std::vector<ferry::v1::SamplerState> states_ ABSL_GUARDED_BY(mu_);
  int32_t choices_left_ ABSL_GUARDED_BY(mu_) = 0;
  bool handed_off_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<BlockId> blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<BlockId> window_blocks_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point submitted_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point computed_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point pushed_ ABSL_GUARDED_BY(mu_);
  absl::Duration queued_ ABSL_GUARDED_BY(mu_);  // in the engine's queue (TokenEvent::queued)
  // The final puts, posted, for Cancel.
  std::vector<uint64_t> transfers_ ABSL_GUARDED_BY(mu_);
  // Streaming: table blocks [cached_prefix_blocks, streamed_to_) are pushed or being pushed by
  // chunks_ streamed puts (queued or running); after_chunks_ waits for the last. (stream_ and
  // table_blocks_ are set by Start and never written after.)
  bool stream_ = false;
  int64_t table_blocks_ = 0;
  int64_t streamed_to_ ABSL_GUARDED_BY(mu_) = 0;
  int chunks_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status chunk_status_ ABSL_GUARDED_BY(mu_);  // the first failure of a streamed put
  // A posted streamed put failed: its bytes may still land.
  bool uncertain_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> after_chunks_ ABSL_GUARDED_BY(mu_);
  uint64_t streamed_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The push executor's alone (one thread), so not under mu_.
  bool connected_ = false;
  uint64_t peer_ = 0;
  // Puts on the wire, since when, and the union of their times.
  int on_wire_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point wire_since_ ABSL_GUARDED_BY(mu_);
  std::chrono::steady_clock::duration wire_ ABSL_GUARDED_BY(mu_){};
  int pushes_left_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status push_status_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  AbortCause cause_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;
  bool pushing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // With a push: the first tokens' KvReady call and the push, each over; the answer once both.
  bool ready_done_ ABSL_GUARDED_BY(mu_) = false;
  bool push_done_ ABSL_GUARDED_BY(mu_) = false;
  bool settled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status ready_status_ ABSL_GUARDED_BY(mu_);
  absl::Status push_outcome_ ABSL_GUARDED_BY(mu_);
  ferry::v1::Usage usage_ ABSL_GUARDED_BY(mu_);  // what the decode worker was told
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_PREFILL_CALL_H_
