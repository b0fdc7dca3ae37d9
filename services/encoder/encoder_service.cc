#include "services/encoder/encoder_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "media/image/image.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "services/common/grpc_status.h"
#include "services/common/metrics.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "EmbeddingsChunk.data is little-endian float32: the rows are copied as they are in memory"
#endif

namespace ferry {

namespace {

using ferry::v1::EmbeddingsChunk;

void SetHash(const Hash128& h, ferry::v1::Hash128* out) {
  out->set_lo(h.lo);
  out->set_hi(h.hi);
}

Hash128 GetHash(const ferry::v1::Hash128& h) { return Hash128{h.lo(), h.hi()}; }

// A caller that left: its RPC was cancelled or its deadline passed.
bool Gone(grpc::CallbackServerContext* context) {
  return context->IsCancelled() || context->deadline() <= std::chrono::system_clock::now();
}

grpc::Status GoneStatus(grpc::CallbackServerContext* context) {
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call's deadline passed");
}

// A stream that ends at once with `status`.
class RefusedFetch final : public grpc::ServerWriteReactor<EmbeddingsChunk> {
 public:
  explicit RefusedFetch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

class RefusedWatch final : public grpc::ServerWriteReactor<ferry::v1::EncoderStatus> {
 public:
  explicit RefusedWatch(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Test seam: waits while `path` exists (at most 60 s).
void WaitWhileExists(const std::string& path, const char* what) {
  if (path.empty() || access(path.c_str(), F_OK) != 0) return;
  LOG(INFO) << "test seam: " << what << " waits while " << path << " exists";
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (access(path.c_str(), F_OK) == 0 && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Streams one handle's rows, one chunk in flight at a time.
class FetchCall final : public grpc::ServerWriteReactor<EmbeddingsChunk> {
 public:
  FetchCall(EmbeddingRows rows, ferry::v1::EmbeddingsInfo info, int64_t chunk_bytes,
            prometheus::Counter* fetched, std::string hold_file)
      : rows_(std::move(rows)),
        chunk_bytes_(chunk_bytes),
        fetched_(fetched),
        hold_file_(std::move(hold_file)) {
    *out_.mutable_info() = std::move(info);
    Next();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the stream broke"));
      return;
    }
    fetched_->Increment(static_cast<double>(out_.data().size()));
    if (offset_ >= total()) {
      Finish(grpc::Status::OK);
      return;
    }
    out_.clear_info();
    if (!hold_file_.empty() && access(hold_file_.c_str(), F_OK) == 0) {
      // Test seam (fetch_hold_file): the rest waits on a thread of its own, never on gRPC's; the
      // call cannot end meanwhile (no Finish yet), so `this` lives until Next's write is done.
      std::thread([this] {
        WaitWhileExists(hold_file_, "an embeddings stream");
        Next();
      }).detach();
      return;
    }
    Next();
  }
  void OnDone() override { delete this; }

 private:
  int64_t total() const { return static_cast<int64_t>(rows_->size() * sizeof(float)); }
  void Next() {
    const int64_t n = std::min(chunk_bytes_, total() - offset_);
    out_.set_offset(static_cast<uint64_t>(offset_));
    out_.set_data(reinterpret_cast<const char*>(rows_->data()) + offset_, static_cast<size_t>(n));
    offset_ += n;
    StartWrite(&out_);
  }

  const EmbeddingRows rows_;
  const int64_t chunk_bytes_;
  prometheus::Counter* const fetched_;
  const std::string hold_file_;
  int64_t offset_ = 0;
  EmbeddingsChunk out_;
};

}  // namespace

struct EncoderService::Metrics {
  prometheus::Counter* encoded = nullptr;
  prometheus::Counter* hits = nullptr;
  prometheus::Counter* misses = nullptr;
  prometheus::Counter* refused_invalid = nullptr;
  prometheus::Counter* refused_queue_full = nullptr;
  prometheus::Counter* refused_cache_full = nullptr;
  prometheus::Counter* refused_draining = nullptr;
  prometheus::Counter* cancelled = nullptr;
  prometheus::Counter* fetch_bytes = nullptr;
  prometheus::Histogram* encode_seconds = nullptr;
  prometheus::Gauge* cache_bytes = nullptr;
  prometheus::Gauge* cache_capacity_bytes = nullptr;
  prometheus::Gauge* pinned_bytes = nullptr;
  prometheus::Gauge* handles = nullptr;
  prometheus::Gauge* queue_depth = nullptr;
  prometheus::Gauge* encoding = nullptr;
};

EncoderService::EncoderService(const ImageEncoder* encoder, const Hash128& vision_digest,
                               const EncoderServiceOptions& options,
                               std::shared_ptr<prometheus::Registry> registry)
    : encoder_(encoder),
      vision_digest_(vision_digest),
      options_(options),
      registry_(registry != nullptr ? std::move(registry)
                                    : std::make_shared<prometheus::Registry>()),
      metrics_(std::make_unique<Metrics>()),
      cache_(options.cache),
      executor_(std::max(options.threads, 1), options.max_queued),
      watches_([this] { return Status(); }, StatusHubOptions{}) {
  Metrics& m = *metrics_;
  prometheus::Registry& r = *registry_;
  m.encoded = &prometheus::BuildCounter()
                   .Name("ferry_encoder_images_encoded_total")
                   .Help("Images decoded, preprocessed and run through the vision tower.")
                   .Register(r)
                   .Add({});
  auto& lookups = prometheus::BuildCounter()
                      .Name("ferry_encoder_cache_lookups_total")
                      .Help("Encodes looked up in the embedding cache: hit or miss.")
                      .Register(r);
  m.hits = &lookups.Add({{"result", "hit"}});
  m.misses = &lookups.Add({{"result", "miss"}});
  auto& refused = prometheus::BuildCounter()
                      .Name("ferry_encoder_refused_total")
                      .Help(
                          "Encodes refused: invalid (INVALID_ARGUMENT), queue_full and "
                          "cache_full (RESOURCE_EXHAUSTED), draining (UNAVAILABLE).")
                      .Register(r);
  m.refused_invalid = &refused.Add({{"reason", "invalid"}});
  m.refused_queue_full = &refused.Add({{"reason", "queue_full"}});
  m.refused_cache_full = &refused.Add({{"reason", "cache_full"}});
  m.refused_draining = &refused.Add({{"reason", "draining"}});
  m.cancelled = &prometheus::BuildCounter()
                     .Name("ferry_encoder_cancelled_total")
                     .Help("Encode jobs skipped because every caller left while they waited.")
                     .Register(r)
                     .Add({});
  m.fetch_bytes = &prometheus::BuildCounter()
                       .Name("ferry_encoder_fetch_bytes_total")
                       .Help("Embedding bytes streamed by FetchEmbeddings.")
                       .Register(r)
                       .Add({});
  m.encode_seconds = &prometheus::BuildHistogram()
                          .Name("ferry_encoder_encode_seconds")
                          .Help("Decode, preprocess and vision tower of one image.")
                          .Register(r)
                          .Add({}, LatencyBucketsSeconds());
  auto gauge = [&r](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
  };
  m.cache_bytes = gauge("ferry_encoder_cache_bytes", "Embedding bytes cached.");
  m.cache_capacity_bytes =
      gauge("ferry_encoder_cache_capacity_bytes", "The embedding cache's cap (--cache_bytes).");
  m.pinned_bytes = gauge("ferry_encoder_pinned_bytes",
                         "Cached embedding bytes pinned by live handles (never evicted).");
  m.handles = gauge("ferry_encoder_handles", "Live embedding handles.");
  m.queue_depth = gauge("ferry_encoder_queue_depth", "Images waiting for an encoding thread.");
  m.encoding = gauge("ferry_encoder_encoding", "Images being encoded now.");
  m.cache_capacity_bytes->Set(static_cast<double>(cache_.capacity_bytes()));
}

EncoderService::~EncoderService() { executor_.WaitIdle(absl::InfiniteFuture()); }

void EncoderService::RefreshMetrics() {
  const EmbeddingCacheStats s = cache_.Stats();
  metrics_->cache_bytes->Set(static_cast<double>(s.bytes));
  metrics_->pinned_bytes->Set(static_cast<double>(s.pinned_bytes));
  metrics_->handles->Set(static_cast<double>(s.handles));
  metrics_->queue_depth->Set(static_cast<double>(executor_.queued()));
  metrics_->encoding->Set(static_cast<double>(executor_.running()));
}

void EncoderService::FillInfo(const EmbeddingHandle& handle,
                              ferry::v1::EmbeddingsInfo* info) const {
  info->set_handle(handle.handle);
  info->set_num_tokens(static_cast<uint32_t>(encoder_->num_image_tokens()));
  info->set_hidden_size(static_cast<uint32_t>(encoder_->hidden_size()));
  info->set_dtype(ferry::v1::D_TYPE_F32);
  info->set_size_bytes(static_cast<uint64_t>(handle.size_bytes));
  info->set_expires_unix_ms(absl::ToUnixMillis(handle.expires));
  SetHash(vision_digest_, info->mutable_vision_digest());
}

void EncoderService::SetEndpoint(const std::string& endpoint) {
  absl::MutexLock lock(&endpoint_mu_);
  endpoint_ = endpoint;
}

void EncoderService::StartDrain() {
  draining_.store(true);
  watches_.Tick();
}

void EncoderService::StopWatches() { watches_.Shutdown(); }

bool EncoderService::WaitIdle(absl::Time deadline) { return executor_.WaitIdle(deadline); }

void EncoderService::WaitWhileHeld() const {
  WaitWhileExists(options_.hold_file, "image encoding");
}

grpc::ServerUnaryReactor* EncoderService::Encode(grpc::CallbackServerContext* context,
                                                 const ferry::v1::EncodeRequest* request,
                                                 ferry::v1::EncodeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto finish = [this, reactor](const grpc::Status& status) {
    RefreshMetrics();
    reactor->Finish(status);
    return reactor;
  };
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) {
    return finish(s);
  }
  auto invalid = [&](const std::string& message) {
    metrics_->refused_invalid->Increment();
    return finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message));
  };
  // The cache's refusals: NotFound (a lookup's miss) and ResourceExhausted (too many handles).
  auto refuse = [&](const absl::Status& status) {
    if (status.code() == absl::StatusCode::kResourceExhausted) {
      metrics_->refused_cache_full->Increment();
    }
    return finish(ToGrpcStatus(status));
  };
  if (draining_.load()) {
    metrics_->refused_draining->Increment();
    return finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "the encoder is draining: send the image to another one"));
  }
  const std::string& bytes = request->image_data();
  if (bytes.empty()) {
    if (!request->has_content_hash()) {
      return invalid("image_data is empty and no content_hash names a cached image");
    }
    const Hash128 key = GetHash(request->content_hash());
    absl::StatusOr<EmbeddingHandle> handle = cache_.Pin(key);
    if (!handle.ok()) return refuse(handle.status());
    metrics_->hits->Increment();
    cache_hits_.fetch_add(1);
    SetHash(key, response->mutable_content_hash());
    FillInfo(*handle, response->mutable_embeddings());
    response->set_cached(true);
    return finish(grpc::Status::OK);
  }
  if (static_cast<int64_t>(bytes.size()) > options_.max_image_bytes) {
    return invalid(absl::StrCat("the image is ", bytes.size(),
                                " bytes; this encoder takes at most ", options_.max_image_bytes));
  }
  const Hash128 key = Xxh3Hash128(bytes);
  if (request->has_content_hash() && GetHash(request->content_hash()) != key) {
    return invalid(absl::StrCat("content_hash ", GetHash(request->content_hash()).ToHex(),
                                " is not the image bytes' (XXH3-128: ", key.ToHex(), ")"));
  }
  SetHash(key, response->mutable_content_hash());
  if (absl::StatusOr<EmbeddingHandle> hit = cache_.Pin(key); hit.ok()) {
    metrics_->hits->Increment();
    cache_hits_.fetch_add(1);
    FillInfo(*hit, response->mutable_embeddings());
    response->set_cached(true);
    return finish(grpc::Status::OK);
  } else if (hit.status().code() != absl::StatusCode::kNotFound) {
    return refuse(hit.status());
  }
  // The header, before the image takes a place in the queue.
  if (absl::StatusOr<media::ImageInfo> info = media::ProbeImage(bytes, options_.limits);
      !info.ok()) {
    return invalid(std::string(info.status().message()));
  }
  metrics_->misses->Increment();
  Flights::Waiter waiter;
  waiter.gone = [context] { return Gone(context); };
  waiter.done = [this, key, context, response, finish](const absl::StatusOr<EmbeddingRows>& rows) {
    if (!rows.ok()) {
      finish(ToGrpcStatus(rows.status()));
      return;
    }
    if (Gone(context)) {  // no handle for a caller that left: it would pin until its TTL
      finish(GoneStatus(context));
      return;
    }
    absl::StatusOr<EmbeddingHandle> handle = cache_.Put(key, *rows);
    if (!handle.ok()) {
      if (handle.status().code() == absl::StatusCode::kResourceExhausted) {
        metrics_->refused_cache_full->Increment();
      }
      finish(ToGrpcStatus(handle.status()));
      return;
    }
    FillInfo(*handle, response->mutable_embeddings());
    response->set_cached(false);
    finish(grpc::Status::OK);
  };
  if (!flights_.Join(key, std::move(waiter))) return reactor;  // the flight's leader answers
  if (EmbeddingRows cached = cache_.Lookup(key)) {  // a flight ended since the miss above
    flights_.Complete(key, cached);
    return reactor;
  }
  auto copy = std::make_shared<const std::string>(bytes);
  if (!executor_.TrySubmit([this, key, copy] { RunEncode(key, copy); })) {
    metrics_->refused_queue_full->Increment();
    flights_.Complete(key, absl::ResourceExhaustedError(absl::StrCat(
                               executor_.max_queued(),
                               " images already wait for this encoder (--max_queued); retry "
                               "later or send the image to another encoder")));
  }
  RefreshMetrics();
  return reactor;
}

void EncoderService::RunEncode(const Hash128& key, std::shared_ptr<const std::string> bytes) {
  RefreshMetrics();
  WaitWhileHeld();
  if (flights_.AllGone(key)) {
    metrics_->cancelled->Increment();
    flights_.Complete(key, absl::CancelledError("every caller left while the image waited"));
    return;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::shared_ptr<const std::vector<float>>> rows =
      encoder_->Encode(*bytes, key, encoder_->num_image_tokens());
  if (!rows.ok()) {
    if (rows.status().code() == absl::StatusCode::kInvalidArgument) {
      metrics_->refused_invalid->Increment();
    }
    flights_.Complete(key, rows.status());
    return;
  }
  metrics_->encode_seconds->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  metrics_->encoded->Increment();
  images_encoded_.fetch_add(1);
  // Cached for later Encodes even if every caller leaves now; each caller pins its own handle.
  if (absl::StatusOr<EmbeddingHandle> h = cache_.Put(key, *rows); h.ok()) {
    cache_.Release(h->handle);
  }
  flights_.Complete(key, *std::move(rows));
}

grpc::ServerWriteReactor<EmbeddingsChunk>* EncoderService::FetchEmbeddings(
    grpc::CallbackServerContext* context, const ferry::v1::FetchEmbeddingsRequest* request) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) {
    return new RefusedFetch(s);
  }
  if (request->has_destination()) {
    return new RefusedFetch(
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     "this encoder streams embeddings only: fetch them without a destination"));
  }
  absl::StatusOr<EmbeddingRows> rows = cache_.Get(request->handle());
  RefreshMetrics();
  if (!rows.ok()) return new RefusedFetch(ToGrpcStatus(rows.status()));
  ferry::v1::EmbeddingsInfo info;
  info.set_handle(request->handle());
  info.set_num_tokens(static_cast<uint32_t>(encoder_->num_image_tokens()));
  info.set_hidden_size(static_cast<uint32_t>(encoder_->hidden_size()));
  info.set_dtype(ferry::v1::D_TYPE_F32);
  info.set_size_bytes((*rows)->size() * sizeof(float));
  SetHash(vision_digest_, info.mutable_vision_digest());
  return new FetchCall(*std::move(rows), std::move(info), options_.max_chunk_bytes,
                       metrics_->fetch_bytes, options_.fetch_hold_file);
}

grpc::ServerUnaryReactor* EncoderService::Release(grpc::CallbackServerContext* context,
                                                  const ferry::v1::ReleaseRequest* request,
                                                  ferry::v1::ReleaseResponse* /*response*/) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  cache_.Release(request->handle());
  RefreshMetrics();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

ferry::v1::EncoderStatus EncoderService::Status() {
  const EmbeddingCacheStats s = cache_.Stats();
  ferry::v1::EncoderStatus status;
  {
    absl::MutexLock lock(&endpoint_mu_);
    status.set_endpoint(endpoint_);
  }
  status.set_model(options_.model);
  SetHash(vision_digest_, status.mutable_vision_digest());
  status.set_num_image_tokens(static_cast<uint32_t>(encoder_->num_image_tokens()));
  status.set_hidden_size(static_cast<uint32_t>(encoder_->hidden_size()));
  status.set_queued(static_cast<uint32_t>(executor_.queued()));
  status.set_encoding(static_cast<uint32_t>(executor_.running()));
  status.set_max_queued(static_cast<uint32_t>(executor_.max_queued()));
  status.set_threads(static_cast<uint32_t>(executor_.threads()));
  status.set_cache_bytes(static_cast<uint64_t>(s.bytes));
  status.set_cache_capacity_bytes(static_cast<uint64_t>(cache_.capacity_bytes()));
  status.set_pinned_bytes(static_cast<uint64_t>(s.pinned_bytes));
  status.set_handles(static_cast<uint32_t>(s.handles));
  status.set_draining(draining_.load());
  status.set_max_image_bytes(static_cast<uint64_t>(options_.max_image_bytes));
  status.set_images_encoded(images_encoded_.load());
  status.set_cache_hits(cache_hits_.load());
  return status;
}

grpc::ServerUnaryReactor* EncoderService::GetStatus(grpc::CallbackServerContext* context,
                                                    const ferry::v1::EncoderStatusRequest*,
                                                    ferry::v1::EncoderStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  *response = Status();
  RefreshMetrics();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<ferry::v1::EncoderStatus>* EncoderService::Watch(
    grpc::CallbackServerContext* context, const ferry::v1::EncoderWatchRequest*) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) {
    return new RefusedWatch(s);
  }
  return watches_.Subscribe(context);
}

}  // namespace ferry
