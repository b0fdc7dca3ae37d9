#include "router/dispatch/token_stream_hub.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"

namespace ferry {

// One worker's stream: the Tokens call (StartCall, then Read after Read until one fails, then
// Finish, each completing on its completion thread) and the listeners attached to it.
class TokenStreamHub::Stream {
 public:
  Stream(TokenStreamHub* hub, std::string worker, std::string id,
         std::shared_ptr<v1::Worker::Stub> stub, CompletionThread* completions)
      : hub_(hub),
        worker_(std::move(worker)),
        id_(std::move(id)),
        stub_(std::move(stub)),
        completions_(completions) {
    AttachSharedToken(&context_, hub_->options_.auth_token);
    request_.set_stream_id(id_);
  }

  const std::string& worker() const { return worker_; }
  const std::string& id() const { return id_; }

  void Start() {
    reader_ = stub_->PrepareAsyncTokens(&context_, request_, completions_->queue());
    reader_->StartCall(&on_started_);
  }

  // A tag for `listener` (referenced) while the stream is open; nullopt before or after.
  std::optional<uint64_t> Attach(TokenStreamListener* listener) {
    absl::MutexLock lock(&mu_);
    if (!open_ || ended_ || closed_) return std::nullopt;
    const uint64_t tag = ++next_tag_;
    listener->Ref();
    listeners_.emplace(tag, listener);
    return tag;
  }

  // The listener of `tag`, detached (the caller drops the reference), or null.
  TokenStreamListener* Detach(uint64_t tag) {
    absl::MutexLock lock(&mu_);
    auto it = listeners_.find(tag);
    if (it == listeners_.end()) return nullptr;
    TokenStreamListener* listener = it->second;
    listeners_.erase(it);
    return listener;
  }

  // The router ends the stream (the worker is down, or shutdown).
  void Close() {
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
    }
    context_.TryCancel();
  }

 private:
  void OnStarted(bool ok) {
    if (!ok) return reader_->Finish(&status_, &on_finished_);
    reader_->Read(&batch_, &on_read_);
  }

  void OnRead(bool ok) {
    if (!ok) return reader_->Finish(&status_, &on_finished_);
    if (batch_.opened()) {
      absl::MutexLock lock(&mu_);
      open_ = true;
    }
    targets_.clear();
    int64_t chunks = 0, dropped = 0;
    {
      absl::MutexLock lock(&mu_);
      for (v1::TaggedChunks& entry : *batch_.mutable_calls()) {
        chunks += entry.chunks_size();
        auto it = listeners_.find(entry.tag());
        if (it == listeners_.end()) {
          dropped += entry.chunks_size();
          continue;
        }
        it->second->Ref();
        targets_.emplace_back(it->second, &entry);
      }
    }
    for (auto& [listener, entry] : targets_) {
      listener->OnChunks(*entry);
      listener->Unref();
    }
    if (chunks > 0 && hub_->observer_.message) hub_->observer_.message(chunks, dropped);
    batch_.Clear();
    reader_->Read(&batch_, &on_read_);
  }

  void OnFinished(bool) {
    flat_listeners lost;
    bool was_open = false, closed = false;
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
      was_open = open_;
      closed = closed_;
      lost.swap(listeners_);
    }
    const std::string why =
        closed ? absl::StrCat("the router closed its token stream to worker ", worker_)
               : absl::StrCat(
                     "the token stream from worker ", worker_, " ended: ",
                     status_.error_message().empty() ? "no reason given" : status_.error_message());
    for (auto& [tag, listener] : lost) {
      listener->OnStreamLost(why);
      listener->Unref();
    }
    const char* how = closed ? "closed" : was_open ? "broken" : "refused";
    if (!closed) {
      LOG(INFO) << "token stream " << id_ << " from worker " << worker_ << " " << how << ": "
                << status_.error_message();
    }
    // A worker that does not know the call is asked again much later; one that could not be
    // reached (restarting, say) at the next request after reopen_after.
    const bool unknown = !was_open && status_.error_code() == grpc::StatusCode::UNIMPLEMENTED;
    const absl::Duration wait = closed    ? absl::ZeroDuration()
                                : unknown ? hub_->options_.retry_after
                                          : hub_->options_.reopen_after;
    TokenStreamHub* hub = hub_;
    hub->Ended(this, how, wait);  // may destroy the hub's last wait: nothing after it
  }

  using flat_listeners = absl::flat_hash_map<uint64_t, TokenStreamListener*>;

  TokenStreamHub* const hub_;
  const std::string worker_;
  const std::string id_;
  const std::shared_ptr<v1::Worker::Stub> stub_;
  CompletionThread* const completions_;
  grpc::ClientContext context_;
  v1::TokenStreamRequest request_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::TokenBatch>> reader_;
  MethodTag<Stream> on_started_{this, &Stream::OnStarted};
  MethodTag<Stream> on_read_{this, &Stream::OnRead};
  MethodTag<Stream> on_finished_{this, &Stream::OnFinished};
  grpc::Status status_;
  // Completion-thread state: the message being read and, while it is delivered, its listeners.
  v1::TokenBatch batch_;
  std::vector<std::pair<TokenStreamListener*, v1::TaggedChunks*>> targets_;

  absl::Mutex mu_;
  flat_listeners listeners_ ABSL_GUARDED_BY(mu_);  // each with a reference
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 0;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

namespace {

constexpr size_t kMaxNotBefore = 4096;

uint64_t RandomIncarnation() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

TokenStreamHub::TokenStreamHub(TokenStreamHubOptions options, TokenStreamHubObserver observer)
    : options_(std::move(options)),
      observer_(std::move(observer)),
      incarnation_(RandomIncarnation()) {}

TokenStreamHub::~TokenStreamHub() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [worker, stream] : streams_) stream->Close();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (live_ > 0 && !idle_.WaitWithDeadline(&mu_, give_up)) {
  }
  if (live_ > 0) LOG(ERROR) << live_ << " token stream(s) did not end within 30 s";
}

std::optional<TokenStreamRoute> TokenStreamHub::Attach(
    const std::string& worker, const std::shared_ptr<v1::Worker::Stub>& stub,
    TokenStreamListener* listener) {
  if (!options_.enabled || options_.completions.empty() || stub == nullptr) return std::nullopt;
  Stream* opened = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return std::nullopt;
    if (auto it = streams_.find(worker); it != streams_.end()) {
      std::optional<uint64_t> tag = it->second->Attach(listener);
      if (!tag.has_value()) return std::nullopt;
      return TokenStreamRoute{it->second->id(), *tag};
    }
    opened = NewStreamLocked(worker, stub);
  }
  if (opened != nullptr) opened->Start();
  return std::nullopt;
}

void TokenStreamHub::Open(const std::string& worker,
                          const std::shared_ptr<v1::Worker::Stub>& stub) {
  if (!options_.enabled || options_.completions.empty() || stub == nullptr) return;
  Stream* opened = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || streams_.contains(worker)) return;
    not_before_.erase(worker);  // (just found up: a new process, worth asking at once)
    opened = NewStreamLocked(worker, stub);
  }
  if (opened != nullptr) opened->Start();
}

TokenStreamHub::Stream* TokenStreamHub::NewStreamLocked(
    const std::string& worker, const std::shared_ptr<v1::Worker::Stub>& stub) {
  if (auto it = not_before_.find(worker); it != not_before_.end()) {
    if (absl::Now() < it->second) return nullptr;
    not_before_.erase(it);
  }
  const uint64_t n = next_stream_++;
  Stream* stream =
      new Stream(this, worker, absl::StrCat("router-", absl::Hex(incarnation_), "-", n), stub,
                 options_.completions[n % options_.completions.size()]);
  streams_.emplace(worker, stream);
  ++live_;
  if (observer_.streams) observer_.streams(static_cast<int64_t>(streams_.size()));
  return stream;
}

void TokenStreamHub::Detach(const std::string& worker, const TokenStreamRoute& route) {
  TokenStreamListener* listener = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = streams_.find(worker);
    if (it == streams_.end() || it->second->id() != route.stream_id) return;
    listener = it->second->Detach(route.tag);
  }
  if (listener != nullptr) listener->Unref();
}

void TokenStreamHub::Close(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(worker);
  if (it == streams_.end()) return;
  it->second->Close();
}

int64_t TokenStreamHub::open_streams() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(streams_.size());
}

void TokenStreamHub::Ended(Stream* stream, const char* how, absl::Duration wait_before_reopen) {
  if (observer_.ended) observer_.ended(how);
  absl::MutexLock lock(&mu_);
  auto it = streams_.find(stream->worker());
  if (it != streams_.end() && it->second == stream) {
    streams_.erase(it);
    if (observer_.streams) observer_.streams(static_cast<int64_t>(streams_.size()));
  }
  if (wait_before_reopen > absl::ZeroDuration() && !stopping_) {
    const absl::Time now = absl::Now();
    if (not_before_.size() >= kMaxNotBefore) {  // workers long gone: forget the expired
      absl::erase_if(not_before_, [now](const auto& entry) { return entry.second <= now; });
    }
    if (not_before_.size() < kMaxNotBefore) {
      not_before_[stream->worker()] = now + wait_before_reopen;
    }
  }
  delete stream;
  if (--live_ == 0) idle_.SignalAll();
}

}  // namespace ferry
