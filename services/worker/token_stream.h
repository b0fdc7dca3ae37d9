// The worker's token streams (worker.proto Tokens; docs/design/token-streams.md): one per router,
// each carrying the output of every Generate call that names it, one message per engine pass with
// every such call's chunks of that pass. A router with 500 requests on this worker gets one
// message a step instead of 500, and wakes once for them.
//
// How output reaches a stream: a call with chunks pending marks itself dirty on its stream
// (MarkDirty, which takes a reference to the call). Flush takes every dirty call's chunks
// (TokenStreamSource::TakeChunks) into one TokenBatch and writes it; while a write is in flight,
// more calls mark themselves dirty and their chunks (merged per choice by the call) go in the
// next message, so a slow reader costs one message per pass, not one per token. The worker
// flushes every stream after each engine pass (TokenStreams::FlushAll from the engine thread);
// a call whose chunks appear outside a pass flushes its stream itself.
//
// Bounds: at most max_streams streams per worker; per stream one message in flight and what the
// dirty calls hold (each call's pending chunks, which the call bounds by merging per choice).
//
// A stream that breaks (its write fails, the caller cancels it, the worker shuts down) refuses
// new chunks (MarkDirty returns false) and tells its dirty calls (StreamLost): their output can
// no longer be delivered, and the router, whose reader broke too, moves them elsewhere.
//
// Lifetime: a TokenStream is reference-counted: gRPC's reference until OnDone, the registry's
// while it is open, and one per call that sends on it (TokenStreams::Find). Thread-safe; lock
// order: a stream's flush lock, then a call's lock, then the stream's state lock.

#ifndef FERRY_SERVICES_WORKER_TOKEN_STREAM_H_
#define FERRY_SERVICES_WORKER_TOKEN_STREAM_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/worker.grpc.pb.h"

namespace ferry {

// What a stream takes output from (a Generate call).
class TokenStreamSource {
 public:
  virtual ~TokenStreamSource() = default;
  // Appends the source's pending chunks (as one TaggedChunks entry) to `batch` and forgets them;
  // true when the source should be pumped afterwards (its last chunks left: its closing message
  // may follow). Called with the stream's flush lock held.
  virtual bool TakeChunks(ferry::v1::TokenBatch* batch) = 0;
  // The stream broke with the source's chunks pending.
  virtual void StreamLost() = 0;
  // After TakeChunks returned true, without the stream's locks.
  virtual void PumpAfterFlush() = 0;
  virtual void Ref() = 0;
  virtual void Unref() = 0;
};

class TokenStreams;

class TokenStream final : public grpc::ServerWriteReactor<ferry::v1::TokenBatch> {
 public:
  // Writes the opening message at once.
  TokenStream(TokenStreams* owner, std::string id);

  const std::string& id() const { return id_; }

  // `source` has chunks pending: it joins the next message (once; the stream holds a reference to
  // it until then). False when the stream broke: the source's output cannot be delivered.
  bool MarkDirty(TokenStreamSource* source);
  // Writes the dirty sources' chunks now, or right after the write in flight.
  void Flush();
  // Ends the stream UNAVAILABLE (the worker shuts down).
  void Close();

  void Ref();
  void Unref();

 private:
  ~TokenStream() override = default;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;
  // The stream broke: refuse chunks, tell the dirty sources, leave the registry, and finish once
  // no write is in flight.
  void Break(const grpc::Status& status);
  // Finishes with status_ once no write is in flight (at most once). Under mu_.
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  TokenStreams* const owner_;
  const std::string id_;
  std::atomic<int> refs_{1};  // gRPC's, until OnDone

  // Held while a message is built from the dirty sources (so that two flushes never interleave
  // one source's chunks out of order); taken before any source's lock.
  absl::Mutex flush_mu_;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(flush_mu_);
  std::vector<TokenStreamSource*> dirty_ ABSL_GUARDED_BY(mu_);  // each with a reference
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool flush_wanted_ ABSL_GUARDED_BY(mu_) = false;  // a flush came while a write was in flight
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  // The message in flight: built while no write is, then gRPC's until OnWriteDone.
  ferry::v1::TokenBatch out_;
};

// Counters a worker's streams report (worker metrics); any may be empty.
struct TokenStreamObserver {
  std::function<void(int64_t open)> streams;
  std::function<void(int64_t chunks)> message;  // a message written, with its chunks
};

// The streams open on one worker, by id.
class TokenStreams {
 public:
  TokenStreams(size_t max_streams, TokenStreamObserver observer);
  ~TokenStreams();  // Close()

  // The Tokens call (the caller checked its token): a new stream, or a refusal (an empty or
  // over-long id, one in use, too many streams, closed).
  grpc::ServerWriteReactor<ferry::v1::TokenBatch>* Open(
      grpc::CallbackServerContext* context, const ferry::v1::TokenStreamRequest* request);
  // The open stream named `id` with a reference for the caller (Unref it), or null.
  TokenStream* Find(const std::string& id);
  // Flushes every open stream (after each engine pass, on the engine thread).
  void FlushAll();
  // Ends every stream and refuses new ones.
  void Close();

 private:
  friend class TokenStream;
  void Remove(TokenStream* stream);
  void Written(int64_t chunks);

  const size_t max_streams_;
  const TokenStreamObserver observer_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, TokenStream*> open_ ABSL_GUARDED_BY(mu_);  // with a ref each
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_TOKEN_STREAM_H_
