#include "services/worker/embedding_fetcher.h"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "kvstore/wire.h"
#include "services/common/grpc_client.h"

namespace ferry {

namespace {

constexpr size_t kMaxHandleBytes = 256;
constexpr size_t kMaxEndpointBytes = 256;

}  // namespace

void FetchCancel::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

bool FetchCancel::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

bool FetchCancel::Attach(grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return false;
  context_ = context;
  return true;
}

void FetchCancel::Detach() {
  absl::MutexLock lock(&mu_);
  context_ = nullptr;
}

EmbeddingFetcher::EmbeddingFetcher(EmbeddingFetcherOptions options, const WireLimits& limits,
                                   const Hash128& vision_digest, WorkerMetrics* metrics)
    : options_(std::move(options)),
      limits_(limits),
      vision_digest_(vision_digest),
      metrics_(metrics) {}

std::shared_ptr<v1::Encoder::Stub> EmbeddingFetcher::Stub(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  auto it = stubs_.find(endpoint);
  if (it != stubs_.end()) return it->second;
  if (stubs_.size() >= options_.max_channels) stubs_.erase(stubs_.begin());
  // An encoder restarted on its address is reached at once, not after gRPC's growing backoff.
  ChannelOptions channel;
  channel.max_reconnect_backoff = absl::Milliseconds(250);
  auto stub =
      std::shared_ptr<v1::Encoder::Stub>(v1::Encoder::NewStub(NewChannel(endpoint, channel)));
  stubs_.emplace(endpoint, stub);
  return stub;
}

absl::Status EmbeddingFetcher::Fetch(const v1::TokenizedRequest& request, absl::Time call_deadline,
                                     FetchCancel* cancel, FetchedImages* fetched) {
  fetched->assign(request.images_size(), nullptr);
  const v1::RequestContext& context = request.context();
  absl::Time request_deadline = call_deadline;
  if (context.deadline_unix_ms() > 0) {
    request_deadline = std::min(request_deadline, absl::FromUnixMillis(context.deadline_unix_ms()));
  }
  const absl::Time deadline = std::min(request_deadline, absl::Now() + options_.max_fetch_time);
  int64_t used_bytes = 0;
  for (int i = 0; i < request.images_size(); ++i) {
    const v1::PromptImage& image = request.images(i);
    if (image.embeddings_handle().empty() || !image.image_data().empty() ||
        !image.embeddings().empty()) {
      continue;  // nothing to fetch, or a conflict ToEngineRequest refuses
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<std::shared_ptr<const std::vector<float>>> rows =
        FetchOne(i, image, context, deadline, request_deadline,
                 limits_.max_image_embedding_bytes - used_bytes, cancel);
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    if (!rows.ok()) {
      const char* outcome = "failed";
      switch (rows.status().code()) {
        case absl::StatusCode::kUnavailable:
          outcome = "unavailable";
          break;
        case absl::StatusCode::kCancelled:
          outcome = "cancelled";
          break;
        case absl::StatusCode::kDeadlineExceeded:
          outcome = "deadline";
          break;
        default:
          outcome = "refused";  // the embeddings are not what this request and model take
          break;
      }
      metrics_->ImageFetch(outcome, 0, seconds);
      fetched->clear();  // every buffer goes with the failed request
      return rows.status();
    }
    const int64_t bytes = static_cast<int64_t>((*rows)->size() * sizeof(float));
    used_bytes += bytes;
    metrics_->ImageFetch("fetched", static_cast<uint64_t>(bytes), seconds);
    (*fetched)[i] = *std::move(rows);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const std::vector<float>>> EmbeddingFetcher::FetchOne(
    int index, const v1::PromptImage& image, const v1::RequestContext& context, absl::Time deadline,
    absl::Time request_deadline, int64_t budget_bytes, FetchCancel* cancel) {
  const std::string& handle = image.embeddings_handle();
  const std::string& endpoint = image.encoder_endpoint();
  const std::string what = absl::StrCat("image ", index, " (handle ", handle.substr(0, 64), ")");
  if (handle.size() > kMaxHandleBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("image ", index, ": embeddings_handle is longer than ", kMaxHandleBytes));
  }
  if (endpoint.empty() || endpoint.size() > kMaxEndpointBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": encoder_endpoint must name the encoder holding it (\"host:port\", at most ",
        kMaxEndpointBytes, " bytes)"));
  }
  const int64_t rows = image.placeholder_length();
  const int64_t cols = limits_.hidden_size;
  const int64_t want_bytes = rows * cols * static_cast<int64_t>(sizeof(float));
  if (want_bytes > budget_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the images' embeddings exceed ",
                                                   limits_.max_image_embedding_bytes, " bytes"));
  }
  const std::string from = absl::StrCat(what, " from encoder ", endpoint);
  const absl::Time now = absl::Now();
  if (now >= request_deadline) {
    return absl::DeadlineExceededError(
        absl::StrCat("the request's deadline passed before ", from, " was fetched"));
  }
  grpc::ClientContext rpc;
  rpc.set_deadline(absl::ToChronoTime(std::max(deadline, now)));
  AttachSharedToken(&rpc, options_.auth_token);
  if (!context.trace_id().empty()) rpc.AddMetadata(kTraceIdMetadataKey, context.trace_id());
  v1::FetchEmbeddingsRequest fetch;
  *fetch.mutable_context() = context;
  fetch.set_handle(handle);
  if (!cancel->Attach(&rpc)) {
    return absl::CancelledError(absl::StrCat("the caller went away before ", from));
  }
  std::unique_ptr<grpc::ClientReader<v1::EmbeddingsChunk>> reader =
      Stub(endpoint)->FetchEmbeddings(&rpc, fetch);
  auto values = std::make_shared<std::vector<float>>();
  int64_t filled = 0;
  bool first = true;
  absl::Status bad;  // what this side refused (the stream is then cancelled)
  v1::EmbeddingsChunk chunk;
  while (reader->Read(&chunk)) {
    if (first) {
      first = false;
      const v1::EmbeddingsInfo& info = chunk.info();
      const Hash128 digest = kv::HashFromProto(info.vision_digest());
      if (digest != vision_digest_) {
        bad = absl::FailedPreconditionError(absl::StrCat(
            from, ": its vision tower (digest ", digest.ToHex(), ") is not this worker's (",
            vision_digest_.ToHex(), "): send the image to an encoder of this model"));
      } else if (static_cast<int64_t>(info.num_tokens()) != rows) {
        bad = absl::InvalidArgumentError(absl::StrCat(from, ": ", info.num_tokens(),
                                                      " embedding rows, but the image has ", rows,
                                                      " placeholders"));
      } else if (static_cast<int64_t>(info.hidden_size()) != cols ||
                 info.dtype() != v1::D_TYPE_F32) {
        bad = absl::FailedPreconditionError(
            absl::StrCat(from, ": rows of ", info.hidden_size(), " values of dtype ", info.dtype(),
                         ", this model takes ", cols, " float32 values"));
      } else if (info.size_bytes() != static_cast<uint64_t>(want_bytes)) {
        bad = absl::FailedPreconditionError(absl::StrCat(from, ": ", info.size_bytes(),
                                                         " bytes announced, want ", want_bytes,
                                                         " (rows x cols x 4)"));
      } else {
        values->resize(static_cast<size_t>(rows * cols));
      }
    }
    if (bad.ok() && (chunk.offset() != static_cast<uint64_t>(filled) ||
                     filled + static_cast<int64_t>(chunk.data().size()) > want_bytes ||
                     chunk.data().size() % sizeof(float) != 0)) {
      bad = absl::UnavailableError(
          absl::StrCat(from, ": a chunk at offset ", chunk.offset(), " of ", chunk.data().size(),
                       " bytes does not continue the ", filled, " bytes received"));
    }
    if (!bad.ok()) break;
    const unsigned char* in = reinterpret_cast<const unsigned char*>(chunk.data().data());
    float* out = values->data() + filled / static_cast<int64_t>(sizeof(float));
    for (size_t k = 0; k < chunk.data().size(); k += 4, in += 4, ++out) {
      const uint32_t u =
          uint32_t{in[0]} | uint32_t{in[1]} << 8 | uint32_t{in[2]} << 16 | uint32_t{in[3]} << 24;
      std::memcpy(out, &u, sizeof(float));
      if (!std::isfinite(*out)) {
        bad = absl::FailedPreconditionError(absl::StrCat(from, ": a value is not finite"));
        break;
      }
    }
    if (!bad.ok()) break;
    filled += static_cast<int64_t>(chunk.data().size());
  }
  if (!bad.ok()) {
    rpc.TryCancel();
    while (reader->Read(&chunk)) {
    }
  }
  const grpc::Status status = reader->Finish();
  cancel->Detach();
  if (!bad.ok()) return bad;
  if (cancel->cancelled()) {
    return absl::CancelledError(
        absl::StrCat("the caller went away while ", from, " was being fetched"));
  }
  if (!status.ok()) {
    if (absl::Now() >= request_deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("the request's deadline passed while ", from, " was being fetched"));
    }
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
      return absl::UnavailableError(
          absl::StrCat(from, ": the encoder no longer holds the handle (expired or released: ",
                       status.error_message(), "); encode the image again"));
    }
    return absl::UnavailableError(absl::StrCat(from, " failed (", status.error_code(), ": ",
                                               status.error_message(),
                                               "); encode the image again"));
  }
  if (first || filled != want_bytes) {
    return absl::UnavailableError(
        absl::StrCat(from, ": the stream ended after ", filled, " of ", want_bytes, " bytes"));
  }
  return std::shared_ptr<const std::vector<float>>(std::move(values));
}

}  // namespace ferry
