// The worker half of E/P/D: a request whose images name embeddings held by ferry-encoder
// (PromptImage.embeddings_handle + encoder_endpoint, encoder.proto) has them fetched here with
// FetchEmbeddings before the request starts; the rows then enter the request exactly as inline
// embeddings do (worker_wire.h's FetchedImages). The image's content_hash stays its block-hash
// identity: the rows are only what fills its placeholders.
//
// Checks, per image, on the first chunk's EmbeddingsInfo before anything is allocated:
// num_tokens == placeholder_length (InvalidArgument: the request's span is not what the encoder
// made), hidden_size == the model's, dtype F32, vision_digest == this worker's tower's
// (FailedPrecondition: the encoder runs another vision model, whose rows would be another KV),
// size_bytes == rows x cols x 4, and all images' bytes together within the worker's
// max_image_embedding_bytes (InvalidArgument). Chunks must arrive in order, inside the size, and
// the values be finite.
//
// Failures the router acts on by encoding the image again (elsewhere) and retrying: the encoder
// unreachable, slow past the fetch's cap, or cutting the stream before the last byte, and a
// handle it no longer holds (NOT_FOUND there: expired or released) are all UNAVAILABLE here, the
// message naming the image, the handle and the encoder. The caller gone: CANCELLED; the
// request's own deadline passed: DEADLINE_EXCEEDED.
//
// Every call carries the worker's shared token and a deadline: the earliest of the request's
// (RequestContext.deadline_unix_ms), its gRPC call's, and now + max_fetch_time. Channels to
// encoders are kept, at most max_channels (beyond, one is dropped). FetchCancel stops a fetch
// in flight from another thread (the Generate or Prefill call's OnCancel).
//
// Thread-safe. Fetch blocks its thread (the worker's image executor): never call it on a gRPC
// callback thread.

#ifndef FERRY_SERVICES_WORKER_EMBEDDING_FETCHER_H_
#define FERRY_SERVICES_WORKER_EMBEDDING_FETCHER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "ferry/v1/encoder.grpc.pb.h"
#include "ferry/v1/worker.pb.h"
#include "services/common/shared_token.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_wire.h"

namespace ferry {

// Stops a fetch in flight, and any the same call would start later. Thread-safe.
class FetchCancel {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class EmbeddingFetcher;
  // The fetch's context while its call runs; false (nothing attached) when already cancelled.
  bool Attach(grpc::ClientContext* context);
  void Detach();

  mutable absl::Mutex mu_;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

struct EmbeddingFetcherOptions {
  SharedToken auth_token;  // sent with every call (none: nothing sent)
  // The most one request's fetches may take, whatever its deadline.
  absl::Duration max_fetch_time = absl::Seconds(30);
  size_t max_channels = 64;
};

class EmbeddingFetcher {
 public:
  // `limits` (hidden size, byte cap) and `metrics` outlive the fetcher; `vision_digest` is this
  // worker's tower's (ImageEncoder::vision_digest).
  EmbeddingFetcher(EmbeddingFetcherOptions options, const WireLimits& limits,
                   const Hash128& vision_digest, WorkerMetrics* metrics);

  // Fetches the rows of every image of `request` that names a handle and carries neither
  // image_data nor inline embeddings (those conflicts are ToEngineRequest's to refuse) into
  // `fetched` (sized to the images). `call_deadline`: the gRPC call's (InfiniteFuture: none).
  absl::Status Fetch(const ferry::v1::TokenizedRequest& request, absl::Time call_deadline,
                     FetchCancel* cancel, FetchedImages* fetched);

 private:
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> FetchOne(
      int index, const ferry::v1::PromptImage& image, const ferry::v1::RequestContext& context,
      absl::Time deadline, absl::Time request_deadline, int64_t budget_bytes, FetchCancel* cancel);
  std::shared_ptr<ferry::v1::Encoder::Stub> Stub(const std::string& endpoint);

  const EmbeddingFetcherOptions options_;
  const WireLimits& limits_;
  const Hash128 vision_digest_;
  WorkerMetrics* const metrics_;

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<ferry::v1::Encoder::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry

#endif  // FERRY_SERVICES_WORKER_EMBEDDING_FETCHER_H_
