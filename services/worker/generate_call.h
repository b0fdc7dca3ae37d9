// One Generate call (worker.proto): the request goes to the engine, and what the engine thread
// delivers streams back as GenerateEvents: TokenChunks with absolute output indexes (the tokens
// of a choice that arrived while a write was in flight are merged into one chunk, so a slow
// reader costs one message per choice, not one per token), then Usage; or an ErrorInfo and the
// matching status.
//
// Disaggregated (a decode worker, `aggregated` unset): the call first reserves KV blocks (the
// prompt's, taking the longest prefix this worker's cache holds) and sends a KvReservation; a
// prefill worker calls KvReady with every choice's first token as soon as it sampled them, and
// pushes the rest of the KV into those blocks, its last puts naming the reservation's transfer
// ids. The transport's notifications of those (IncomingKv) are the one signal that the KV is in:
// once they and the first tokens are here, the first tokens are streamed and the choices still
// running continue as a decode-only engine request. KV that does not arrive by the reservation's
// deadline, or a KvReady with an error (before the first tokens, or after them: the push
// failed), ends the call UNAVAILABLE (retryable: nothing was streamed); the blocks go back once
// no push can reach them.
//
// Drain hand-off. Source: the first AbortFor(kDrained) on a worker that hands off asks the
// engine to park the request (Engine::Park; a request of several choices runs on, and may still
// complete); its kHandoff event gives the KV to the service (AddParked) and the call ends
// UNAVAILABLE, retryable, with ErrorInfo.handoff_endpoint. A second AbortFor(kDrained) ends it.
// Before that, when the drain begins, PlanHandoff tells the caller (handoff_planned) so that the
// target can pre-copy the KV computed so far (WorkerService::PrefetchKv).
// Target (handoff_source_endpoint set; decode or aggregated role, one resumed choice): the call
// reserves blocks for the prompt and the output but its last token, sends the KvReservation, and
// calls PushKv on the source; once the push landed and PushKv answered, the request continues as a
// decode-only engine request from the last token, which is not sent again. A failed hand-off ends
// the call UNAVAILABLE, retryable.
//
// With a KV store (aggregated calls): the prefix the worker's memory lacks is read from the store
// first (StoreReader; kLoading), then the request goes to the engine with it. The blocks the
// request computes go to the store's writer (both roles).
//
// How it ends: every choice finished -> Usage, OK. The caller cancelled (or its deadline passed)
// -> the engine request is aborted at its next step, the call ends CANCELLED. Abort RPC -> ABORT
// chunks, Usage, OK. RequestContext.deadline_unix_ms passed -> DEADLINE_EXCEEDED. Drain deadline
// -> UNAVAILABLE, retryable. Engine error -> its status.
//
// Token stream (GenerateRequest.token_stream_id naming one this worker holds; token_stream.h): the
// chunks, merged per choice as above, leave on the stream instead (the call marks itself dirty
// there; the stream takes them at its next message, after the engine pass or at once for chunks
// made outside one), and the call carries its reservation, its last event with the number of
// chunks that went on the stream (GenerateEvent.multiplexed_chunks), sent once the stream took
// the last of them, and its status. A stream that broke ends the call as a caller gone away.
//
// Lifetime: created by WorkerService::Generate, deletes itself when gRPC is done with it
// (OnDone) and the engine has delivered its last event, whichever is later.
//
// Thread-safe: engine events arrive on the engine thread, gRPC callbacks on its threads,
// aborts on others; state is under mu_, and no lock is held while starting a write.

#ifndef FERRY_SERVICES_WORKER_GENERATE_CALL_H_
#define FERRY_SERVICES_WORKER_GENERATE_CALL_H_

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "ferry/v1/worker.grpc.pb.h"
#include "services/worker/embedding_fetcher.h"
#include "services/worker/incoming_kv.h"
#include "services/worker/token_stream.h"

namespace ferry {

class WorkerService;
enum class AbortCause;

class GenerateCall final : public grpc::ServerWriteReactor<ferry::v1::GenerateEvent>,
                           public TokenStreamSource {
 public:
  GenerateCall(WorkerService* service, grpc::CallbackServerContext* context,
               const ferry::v1::GenerateRequest* request);
  ~GenerateCall() override;

  // Ends the request early for `cause` (from the Abort call, the drain, the deadline queue).
  void AbortFor(AbortCause cause);
  // The drain began on a worker that hands off: a request of one choice in the engine is told
  // (GenerateEvent.handoff_planned) that it will be parked at `deadline`, so that the caller can
  // have its next worker pre-copy its KV. Once; nothing for a call in another phase.
  void PlanHandoff(absl::Time deadline);
  // The prefill worker's KvReady for this call's reservation.
  grpc::Status OnKvReady(const ferry::v1::KvReadyRequest& ready);
  // The reservation's deadline (and a second) passed: a call still waiting for KvReady (its KV
  // landed, the prefill worker went quiet) ends UNAVAILABLE. Nothing in other phases.
  void OnKvDeadline();
  // A reference that keeps the call alive (the service takes one under its lock before calling
  // AbortFor or OnKvReady without it). Unref drops it; the last one deletes the call.
  void Ref() override;
  void Unref() override;

  // TokenStreamSource: the call's chunks leave on its token stream (GenerateRequest
  // .token_stream_id), its last event on the call, counting them (multiplexed_chunks).
  bool TakeChunks(ferry::v1::TokenBatch* batch) override;
  void StreamLost() override;
  void PumpAfterFlush() override;

 private:
  // Where the call is (disaggregated calls start at kReserving, aggregated at kSubmitted, or at
  // kLoading while the KV store is read). kStarting: the KV is in and the first tokens are being
  // written; the engine gets the request right after (an abort meanwhile is kept in cause_ and
  // ends the call there, as in kLoading).
  enum class Phase { kLoading, kReserving, kAwaitingKv, kStarting, kSubmitted, kEnded };

  void Start(const ferry::v1::GenerateRequest& request);
  // Finishes before the engine ever saw the request.
  void Reject(const grpc::Status& status, bool invalid);
  void OnEngineEvent(const TokenEvent& event);
  void OnEngineEventInPass(const TokenEvent& event);
  // Aggregated, after the store was read: submits the request (or gives its imports back when
  // the call ended meanwhile or the engine refuses it).
  void SubmitRead(EngineRequest request);
  // Disaggregated: the engine's reservation, the pushes' outcome, and the decode-only start.
  void OnReserved(absl::StatusOr<KvReservation> reserved);
  void OnKvLanded(const absl::Status& status);
  // Both KvReady and the pushes are in: the first tokens wait to be written and the decode-only
  // request is ready (kStarting). True when the call is done instead (every choice ended with its
  // first token, or the answer cannot be resumed).
  bool PrepareDecodeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Once the pushes landed and KvReady (or PushKv's answer) came: PrepareDecodeLocked, then
  // StartDecode or Done; before that, Pump. Takes the lock held, returns with it released.
  void ContinueOnceKvIsIn() ABSL_UNLOCK_FUNCTION(mu_);
  // Target of a hand-off: the source's PushKv, once the reservation is described.
  void CallPushKv();
  // Then, without mu_: writes the first tokens (before the engine's first decode step competes
  // for the cores) and submits the request; Done() when it cannot run.
  void StartDecode();
  // Takes the KvReady deadline out of the service's queue.
  void ClearKvDeadline() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a disaggregated call that never reached the engine. Takes the lock held, returns with it
  // released.
  void EndBeforeEngine(AbortCause cause, absl::Status error) ABSL_UNLOCK_FUNCTION(mu_);
  // The request left the worker: metrics, deadline, registration. Then Pump and drop the ref.
  void Done();
  // Writes the next message or finishes, when the stream is free. Takes mu_.
  void Pump();
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

  WorkerService* const service_;
  FetchCancel fetch_cancel_;  // OnCancel stops the fetch of the request's embeddings
  grpc::CallbackServerContext* const context_;
  const std::chrono::steady_clock::time_point start_;
  std::atomic<int> refs_{1};  // gRPC's; +1 while the engine holds the request

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kSubmitted;
  // Disaggregated: the request to submit once the KV is in, the blocks it goes to, what was
  // sent and what came back.
  EngineRequest decode_request_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<IncomingKv> kv_ ABSL_GUARDED_BY(mu_);
  std::string transfer_id_ ABSL_GUARDED_BY(mu_);
  absl::Time reservation_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The KV blocks the reservation asks for; set in the error when it was refused (no room now).
  int64_t reservation_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  bool kv_refused_ ABSL_GUARDED_BY(mu_) = false;
  // In the deadline queue while waiting.
  absl::Time kv_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool reservation_ready_ ABSL_GUARDED_BY(mu_) = false;  // reservation_ waits to be written
  ferry::v1::KvReservation reservation_ ABSL_GUARDED_BY(mu_);
  bool kv_landed_ ABSL_GUARDED_BY(mu_) = false;
  bool kv_ready_ ABSL_GUARDED_BY(mu_) = false;
  ferry::v1::KvReadyRequest ready_ ABSL_GUARDED_BY(mu_);
  // Set by Start (from the constructor) and never written after: read without the lock.
  std::string id_, trace_id_;
  bool logprobs_ = false;
  uint64_t seed_ = 0;
  int64_t prompt_tokens_ = 0;
  absl::Time deadline_ = absl::InfiniteFuture();
  // Per choice, empty when nothing waits.
  std::vector<ferry::v1::TokenChunk> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> has_pending_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> next_index_ ABSL_GUARDED_BY(mu_);
  int32_t choices_left_ ABSL_GUARDED_BY(mu_) = 0;
  // Round robin over choices with something pending.
  size_t next_choice_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  // Of cached_tokens_, read from the KV store; decode: prompt tokens this worker held already.
  int64_t store_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t decode_local_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  // The engine refused the request (counted invalid or rejected).
  bool refused_ ABSL_GUARDED_BY(mu_) = false;
  bool first_token_ ABSL_GUARDED_BY(mu_) = false;
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;
  AbortCause cause_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  // The message being written: built under mu_ while no write is in flight, then read by gRPC
  // without the lock until OnWriteDone (writing_ keeps everyone else off it), so not annotated.
  ferry::v1::GenerateEvent out_;
  // Drain hand-off: as the target, the source's "host:port" and the output so far (set by Start
  // and never written after: read without the lock); as the source, whether the engine parked
  // the request (the stream ends naming this worker).
  std::string handoff_source_, handoff_source_id_;
  int64_t handoff_generated_ = 0;
  bool park_requested_ ABSL_GUARDED_BY(mu_) = false;
  // The plan waits to be written (handoff_planned), once.
  bool plan_ready_ ABSL_GUARDED_BY(mu_) = false;
  bool planned_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time plan_deadline_ ABSL_GUARDED_BY(mu_);
  bool parked_ ABSL_GUARDED_BY(mu_) = false;
  // The token stream the chunks leave on (with a reference; null: this call) and the call's tag
  // there (set by Start and never written after: read without the lock); whether the call is in
  // the stream's next message, and the chunks it took (a stream that broke sets broken_).
  TokenStream* stream_ = nullptr;
  uint64_t tag_ = 0;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  uint32_t multiplexed_chunks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_GENERATE_CALL_H_
