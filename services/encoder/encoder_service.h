// The gRPC face of ferry-encoder (proto/ferry/v1/encoder.proto; docs/serving/encoder.md): image
// bytes in, a handle on their embedding rows out, the rows streamed to whoever holds the handle.
//
// Encode: the shared token; UNAVAILABLE once draining; INVALID_ARGUMENT for bytes over
// max_image_bytes, a content_hash that is not the bytes' XXH3-128, or a header media/image
// refuses (ProbeImage: not an image, a size over the limits) — all before any queueing. Then the
// cache (embedding_cache.h) by content hash: a hit answers a new handle at once (cached=true).
// A miss joins the single flight of that hash (single_flight.h): the first caller queues one
// job on the bounded executor (a full queue: RESOURCE_EXHAUSTED, for every caller of that
// flight), the others wait for its result. The job, when a thread takes it, skips the work when
// every caller of the flight has left (cancelled, or its deadline passed: counted cancelled);
// otherwise it decodes, orients, preprocesses and runs the tower (ImageEncoder::Encode), puts the
// rows into the cache and answers every caller with its own handle. A caller whose deadline
// passes while it waits gets DEADLINE_EXCEEDED from gRPC; the rows, once computed, stay cached.
// With empty image_data and a content_hash: a lookup (a handle, or NOT_FOUND).
//
// FetchEmbeddings: the rows of a live handle as little-endian float32 (PromptImage.embeddings'
// format), num_image_tokens x hidden_size, in chunks of at most max_chunk_bytes; the first
// chunk carries the EmbeddingsInfo. NOT_FOUND for an unknown, released or expired handle;
// FAILED_PRECONDITION for a `destination` (the push by the KV transport is not built). A
// stream in progress keeps its rows even when the handle goes meanwhile.
// Release: drops the handle (idempotent: an unknown one is OK too).
// GetStatus: identity and load (EncoderStatus); Watch: the same as a stream (status_hub.h).
//
// Drain (StartDrain, WaitIdle, StopWatches): Encode answers UNAVAILABLE and Watch streams see
// draining; queued and running encodes finish and answer their callers; the Watch streams end
// UNAVAILABLE; fetches of live handles go on until the server stops.
//
// Metrics (on the registry given): ferry_encoder_images_encoded_total,
// ferry_encoder_cache_lookups_total{result=hit|miss}, ferry_encoder_refused_total{reason=
// invalid|queue_full|cache_full|draining} (cache_full: pinned rows fill the cap, or max_handles
// live), ferry_encoder_cancelled_total,
// ferry_encoder_encode_seconds (histogram: decode, preprocess and tower of one image),
// ferry_encoder_fetch_bytes_total, and the gauges ferry_encoder_cache_bytes, _cache_capacity_bytes,
// _pinned_bytes, _handles, _queue_depth, _encoding (refreshed by every call and by RefreshMetrics).
//
// Thread-safe (gRPC's callback threads and the executor's threads).

#ifndef FERRY_SERVICES_ENCODER_ENCODER_SERVICE_H_
#define FERRY_SERVICES_ENCODER_ENCODER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/common/hash128.h"
#include "ferry/v1/encoder.grpc.pb.h"
#include "media/image/image.h"
#include "prometheus/registry.h"
#include "services/common/shared_token.h"
#include "services/encoder/bounded_executor.h"
#include "services/encoder/embedding_cache.h"
#include "services/encoder/single_flight.h"
#include "services/encoder/status_hub.h"
#include "services/vision/image_encoder.h"

namespace ferry {

struct EncoderServiceOptions {
  int64_t max_image_bytes = 20 << 20;
  media::ImageLimits limits;  // the header check's (the ImageEncoder has its own copy)
  EmbeddingCacheOptions cache;
  int threads = 1;
  int64_t max_queued = 64;
  int64_t max_chunk_bytes = 1 << 20;
  SharedToken auth_token;
  std::string model;  // reported by GetStatus
  // Test seam: while this file exists, each encode job waits before encoding (at most 60 s).
  std::string hold_file;
  // Test seam: while this file exists, each FetchEmbeddings stream waits after its first chunk
  // (at most 60 s; on a thread of its own), so that a test may kill the encoder mid-stream.
  std::string fetch_hold_file;
};

class EncoderService final : public ferry::v1::Encoder::CallbackService {
 public:
  // `encoder` must outlive the service; `vision_digest` is its tower's (VisionTower::digest).
  // `registry` may be null (a private one).
  EncoderService(const ImageEncoder* encoder, const Hash128& vision_digest,
                 const EncoderServiceOptions& options,
                 std::shared_ptr<prometheus::Registry> registry);
  ~EncoderService() override;  // waits for the executor's jobs

  grpc::ServerUnaryReactor* Encode(grpc::CallbackServerContext* context,
                                   const ferry::v1::EncodeRequest* request,
                                   ferry::v1::EncodeResponse* response) override;
  grpc::ServerWriteReactor<ferry::v1::EmbeddingsChunk>* FetchEmbeddings(
      grpc::CallbackServerContext* context,
      const ferry::v1::FetchEmbeddingsRequest* request) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const ferry::v1::ReleaseRequest* request,
                                    ferry::v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const ferry::v1::EncoderStatusRequest* request,
                                      ferry::v1::EncoderStatus* response) override;
  grpc::ServerWriteReactor<ferry::v1::EncoderStatus>* Watch(
      grpc::CallbackServerContext* context, const ferry::v1::EncoderWatchRequest* request) override;

  // The status GetStatus answers and Watch streams.
  ferry::v1::EncoderStatus Status();

  // The address GetStatus reports (known once the server has bound its port).
  void SetEndpoint(const std::string& endpoint);

  // Stops admitting encodes (UNAVAILABLE); Watch streams see draining at once.
  void StartDrain();
  // Ends the Watch streams (UNAVAILABLE) and refuses new ones: the last step of a drain, before
  // the server stops (a stream would otherwise hold it for its whole grace).
  void StopWatches();
  // Blocks until no encode is queued or running, or `deadline`; whether it got idle.
  bool WaitIdle(absl::Time deadline);

  void RefreshMetrics();

 private:
  struct Metrics;
  using Flights = SingleFlight<Hash128, EmbeddingRows>;

  void FillInfo(const EmbeddingHandle& handle, ferry::v1::EmbeddingsInfo* info) const;
  // The executor's job for the flight of `key`.
  void RunEncode(const Hash128& key, std::shared_ptr<const std::string> bytes);
  void WaitWhileHeld() const;

  const ImageEncoder* const encoder_;
  const Hash128 vision_digest_;
  const EncoderServiceOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Metrics> metrics_;
  EmbeddingCache cache_;
  Flights flights_;
  std::atomic<bool> draining_{false};
  absl::Mutex endpoint_mu_;
  std::string endpoint_ ABSL_GUARDED_BY(endpoint_mu_);
  std::atomic<uint64_t> images_encoded_{0};
  std::atomic<uint64_t> cache_hits_{0};
  BoundedExecutor executor_;
  StatusHub watches_;  // last: its ticker, which reads the members above, stops first
};

}  // namespace ferry

#endif  // FERRY_SERVICES_ENCODER_ENCODER_SERVICE_H_
