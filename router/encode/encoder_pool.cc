#include "router/encode/encoder_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "ferry/v1/encoder.grpc.pb.h"
#include "router/encode/encoder_choice.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_status.h"

namespace ferry {

struct EncoderPool::Encoder {
  std::string endpoint;
  std::unique_ptr<v1::Encoder::Stub> stub;
  std::thread thread;  // its WatchLoop (joined by SetEndpoints when it leaves, or at the end)
  // Under the pool's mu_.
  bool up = false;
  bool removed = false;  // left the set: its loop ends
  int64_t backlog = 0;
  absl::Time last_seen = absl::InfinitePast();
  std::shared_ptr<grpc::ClientContext> watch;  // the open Watch call (cancelled on stop)
};

namespace {

bool FailsOver(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::INTERNAL:
      return true;
    default:
      return false;
  }
}

absl::Status CheckEndpoint(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(endpoint.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--encoders: '", endpoint, "' is not host:port"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

absl::StatusOr<std::vector<std::string>> CheckEndpoints(std::vector<std::string> endpoints) {
  std::sort(endpoints.begin(), endpoints.end());
  endpoints.erase(std::unique(endpoints.begin(), endpoints.end()), endpoints.end());
  if (endpoints.size() > EncoderPool::kMaxEncoders) {
    return absl::InvalidArgumentError(absl::StrCat("encoders: ", endpoints.size(),
                                                   " given; at most ", EncoderPool::kMaxEncoders));
  }
  for (const std::string& e : endpoints) {
    if (absl::Status s = CheckEndpoint(e); !s.ok()) return s;
  }
  return endpoints;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EncoderPool>> EncoderPool::Start(EncoderPoolOptions options) {
  ASSIGN_OR_RETURN(std::vector<std::string> endpoints, CheckEndpoints(options.endpoints));
  std::unique_ptr<EncoderPool> pool(new EncoderPool(std::move(options)));
  RETURN_IF_ERROR(pool->SetEndpoints(std::move(endpoints)));
  pool->monitor_ = std::thread([p = pool.get()] { p->MonitorLoop(); });
  return pool;
}

EncoderPool::EncoderPool(EncoderPoolOptions options) : options_(std::move(options)) {}

absl::Status EncoderPool::SetEndpoints(std::vector<std::string> endpoints) {
  ASSIGN_OR_RETURN(endpoints, CheckEndpoints(std::move(endpoints)));
  absl::MutexLock set_lock(&set_mu_);
  std::vector<std::pair<std::shared_ptr<Encoder>, bool>> left;  // and whether it was up
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::OkStatus();
    const std::set<std::string> wanted(endpoints.begin(), endpoints.end());
    for (auto it = encoders_.begin(); it != encoders_.end();) {
      if (wanted.count(it->first) != 0) {
        ++it;
        continue;
      }
      it->second->removed = true;
      if (it->second->watch != nullptr) it->second->watch->TryCancel();
      left.emplace_back(it->second, it->second->up);
      it = encoders_.erase(it);
    }
    stop_cv_.SignalAll();
    for (const std::string& endpoint : endpoints) {
      if (encoders_.count(endpoint) != 0) continue;
      auto e = std::make_shared<Encoder>();
      e->endpoint = endpoint;
      e->stub = v1::Encoder::NewStub(NewChannel(endpoint));
      e->thread = std::thread([this, raw = e.get()] { WatchLoop(raw); });
      encoders_.emplace(endpoint, std::move(e));
      LOG(INFO) << "encoder " << endpoint << " added";
    }
  }
  for (const auto& [e, was_up] : left) {
    e->thread.join();
    LOG(INFO) << "encoder " << e->endpoint << " left the set";
    if (was_up && options_.on_state) options_.on_state(e->endpoint, false);
  }
  return absl::OkStatus();
}

EncoderPool::~EncoderPool() {
  Shutdown();
  if (monitor_.joinable()) monitor_.join();
  absl::MutexLock set_lock(&set_mu_);
  std::vector<std::shared_ptr<Encoder>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [endpoint, e] : encoders_) all.push_back(e);
  }
  for (const std::shared_ptr<Encoder>& e : all) e->thread.join();
}

void EncoderPool::Shutdown() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [endpoint, e] : encoders_) {
    if (e->watch != nullptr) e->watch->TryCancel();
  }
  for (grpc::ClientContext* call : calls_) call->TryCancel();
  stop_cv_.SignalAll();
}

size_t EncoderPool::size() const {
  absl::MutexLock lock(&mu_);
  return encoders_.size();
}

int64_t EncoderPool::up() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [endpoint, e] : encoders_) n += e->up ? 1 : 0;
  return n;
}

void EncoderPool::SetUp(Encoder* encoder, bool up, const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    // One that left the set: SetEndpoints reports it down.
    if (encoder->up == up || encoder->removed) return;
    encoder->up = up;
  }
  if (up) {
    LOG(INFO) << "encoder " << encoder->endpoint << " is up";
  } else {
    LOG(WARNING) << "encoder " << encoder->endpoint << " is down: " << why;
  }
  if (options_.on_state) options_.on_state(encoder->endpoint, up);
}

void EncoderPool::WatchLoop(Encoder* encoder) {
  while (true) {
    auto context = std::make_shared<grpc::ClientContext>();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || encoder->removed) return;
      encoder->watch = context;
    }
    AttachSharedToken(context.get(), options_.auth_token);
    context->AddMetadata(kTraceIdMetadataKey, "router-encoder-watch");
    std::unique_ptr<grpc::ClientReader<v1::EncoderStatus>> reader =
        encoder->stub->Watch(context.get(), v1::EncoderWatchRequest());
    v1::EncoderStatus status;
    while (reader->Read(&status)) {
      std::string why;
      if (status.draining()) {
        why = "it is draining";
      } else if (options_.expected_image_tokens != 0 &&
                 status.num_image_tokens() != options_.expected_image_tokens) {
        why = absl::StrCat("it makes ", status.num_image_tokens(),
                           " tokens per image; the model takes ", options_.expected_image_tokens);
      }
      {
        absl::MutexLock lock(&mu_);
        encoder->last_seen = absl::Now();
        encoder->backlog = int64_t{status.queued()} + int64_t{status.encoding()};
      }
      SetUp(encoder, why.empty(), why);
    }
    const grpc::Status result = reader->Finish();
    SetUp(encoder, false,
          result.ok() ? "its status stream ended"
                      : absl::StrCat("its status stream failed: ", result.error_message()));
    absl::MutexLock lock(&mu_);
    encoder->watch = nullptr;
    const absl::Time until = absl::Now() + options_.watch_backoff;
    while (!stopping_ && !encoder->removed && absl::Now() < until) {
      stop_cv_.WaitWithDeadline(&mu_, until);
    }
  }
}

void EncoderPool::MonitorLoop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    stop_cv_.WaitWithTimeout(&mu_, options_.stale_after / 4);
    const absl::Time now = absl::Now();
    for (auto& [endpoint, e] : encoders_) {
      // A stream that went quiet (a partition: no reset reached us) is ended; its loop opens a
      // new one.
      if (e->up && e->watch != nullptr && now - e->last_seen > options_.stale_after) {
        e->watch->TryCancel();
      }
    }
  }
}

absl::StatusOr<EncodedImage> EncoderPool::Encode(const std::string& bytes,
                                                 const Hash128& content_hash, absl::Time deadline,
                                                 const std::string& trace_id) {
  std::vector<EncoderLoadView> views;
  std::vector<std::shared_ptr<Encoder>> encoders;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [endpoint, e] : encoders_) {
      views.push_back({e->endpoint, e->up, e->backlog});
      encoders.push_back(e);
    }
  }
  const std::vector<size_t> order = EncoderOrder(content_hash, views, options_.backlog_slack);
  if (order.empty()) return absl::UnavailableError("no encoder is up");
  v1::EncodeRequest request;
  request.mutable_context()->set_trace_id(trace_id);
  if (deadline != absl::InfiniteFuture()) {
    request.mutable_context()->set_deadline_unix_ms(absl::ToUnixMillis(deadline));
  }
  request.set_image_data(bytes);
  request.mutable_content_hash()->set_lo(content_hash.lo);
  request.mutable_content_hash()->set_hi(content_hash.hi);
  absl::Status last;
  int tried = 0;
  for (size_t index : order) {
    Encoder* encoder = encoders[index].get();
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError("the request's deadline passed while encoding its images");
    }
    ++tried;
    std::unique_ptr<grpc::ClientContext> context =
        NewClientContext(std::min(left, options_.encode_timeout), trace_id);
    AttachSharedToken(context.get(), options_.auth_token);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return absl::UnavailableError("the router is shutting down");
      calls_.insert(context.get());
    }
    v1::EncodeResponse response;
    const grpc::Status status = encoder->stub->Encode(context.get(), request, &response);
    {
      absl::MutexLock lock(&mu_);
      calls_.erase(context.get());
    }
    if (status.ok() && !response.embeddings().handle().empty()) {
      EncodedImage out;
      out.handle = response.embeddings().handle();
      out.endpoint = encoder->endpoint;
      out.num_tokens = response.embeddings().num_tokens();
      out.cached = response.cached();
      out.tried = tried;
      return out;
    }
    last = status.ok() ? absl::InternalError("the encoder answered without a handle")
                       : FromGrpcStatus(status);
    LOG(WARNING) << "encoder " << encoder->endpoint << " failed to encode image "
                 << content_hash.ToHex() << ": " << last;
    if (!status.ok() && !FailsOver(status.error_code())) return last;
  }
  return last;
}

}  // namespace ferry
