#include "services/worker/token_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace ferry {

namespace {

constexpr size_t kMaxStreamIdBytes = 128;
constexpr size_t kMaxMessageBytes = size_t{1} << 20;

class RefusedStream final : public grpc::ServerWriteReactor<v1::TokenBatch> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

TokenStream::TokenStream(TokenStreams* owner, std::string id) : owner_(owner), id_(std::move(id)) {
  absl::MutexLock lock(&mu_);
  out_.set_opened(true);
  writing_ = true;
  StartWrite(&out_);
}

bool TokenStream::MarkDirty(TokenStreamSource* source) {
  absl::MutexLock lock(&mu_);
  if (broken_) return false;
  source->Ref();
  dirty_.push_back(source);
  return true;
}

void TokenStream::Flush() {
  std::vector<TokenStreamSource*> sources;
  std::vector<TokenStreamSource*> pump;
  int64_t chunks = 0;
  bool write = false;
  {
    absl::MutexLock flush(&flush_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (writing_) {
        flush_wanted_ = !dirty_.empty();
        return;
      }
      if (broken_ || dirty_.empty()) return;
      sources.swap(dirty_);
      flush_wanted_ = false;
    }
    out_.Clear();
    // At most about kMaxMessageBytes a message (a router that fell behind gets its backlog in
    // several): the sources past it stay dirty for the next one.
    size_t bytes = 0, taken = 0;
    for (; taken < sources.size() && bytes < kMaxMessageBytes; ++taken) {
      const int before = out_.calls_size();
      if (sources[taken]->TakeChunks(&out_)) pump.push_back(sources[taken]);
      if (out_.calls_size() > before) bytes += out_.calls(out_.calls_size() - 1).ByteSizeLong();
    }
    for (const v1::TaggedChunks& call : out_.calls()) chunks += call.chunks_size();
    std::vector<TokenStreamSource*> left(sources.begin() + static_cast<ptrdiff_t>(taken),
                                         sources.end());
    sources.resize(taken);
    absl::MutexLock lock(&mu_);
    if (!left.empty()) {
      dirty_.insert(dirty_.begin(), left.begin(), left.end());
      flush_wanted_ = true;
    }
    write = out_.calls_size() > 0 && !broken_;
    writing_ = write;
  }
  if (write) {
    owner_->Written(chunks);
    StartWrite(&out_);
  }
  for (TokenStreamSource* source : pump) source->PumpAfterFlush();
  for (TokenStreamSource* source : sources) source->Unref();
}

void TokenStream::OnWriteDone(bool ok) {
  bool again = false;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (broken_) {
      MaybeFinishLocked();
      return;
    }
    again = ok && (flush_wanted_ || !dirty_.empty());
  }
  if (!ok) return Break(grpc::Status(grpc::StatusCode::CANCELLED, "the token stream broke"));
  if (again) Flush();
}

void TokenStream::OnCancel() {
  Break(grpc::Status(grpc::StatusCode::CANCELLED, "the caller closed the token stream"));
}

void TokenStream::Close() {
  Break(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is going away"));
}

void TokenStream::Break(const grpc::Status& status) {
  std::vector<TokenStreamSource*> lost;
  bool first = false;
  {
    absl::MutexLock lock(&mu_);
    if (!broken_) {
      broken_ = true;
      first = true;
      status_ = status;
      lost.swap(dirty_);
    }
    MaybeFinishLocked();  // (or once the write in flight is done)
  }
  if (!first) return;
  owner_->Remove(this);
  for (TokenStreamSource* source : lost) {
    source->StreamLost();
    source->Unref();
  }
}

void TokenStream::MaybeFinishLocked() {
  if (finished_ || writing_) return;
  finished_ = true;
  Finish(status_);
}

void TokenStream::OnDone() { Unref(); }

void TokenStream::Ref() { refs_.fetch_add(1); }

void TokenStream::Unref() {
  if (refs_.fetch_sub(1) == 1) delete this;
}

TokenStreams::TokenStreams(size_t max_streams, TokenStreamObserver observer)
    : max_streams_(max_streams), observer_(std::move(observer)) {}

TokenStreams::~TokenStreams() { Close(); }

grpc::ServerWriteReactor<v1::TokenBatch>* TokenStreams::Open(
    grpc::CallbackServerContext*, const v1::TokenStreamRequest* request) {
  const std::string& id = request->stream_id();
  if (id.empty() || id.size() > kMaxStreamIdBytes) {
    return new RefusedStream(
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     absl::StrCat("stream_id must be 1 to ", kMaxStreamIdBytes, " bytes")));
  }
  int64_t open = 0;
  TokenStream* stream = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (closed_) {
      return new RefusedStream(
          grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is going away"));
    }
    if (open_.contains(id)) {
      return new RefusedStream(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                                            absl::StrCat("token stream ", id, " is open already")));
    }
    if (open_.size() >= max_streams_) {
      return new RefusedStream(
          grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                       absl::StrCat("this worker holds its limit of ", max_streams_,
                                    " token streams (--max_token_streams)")));
    }
    stream = new TokenStream(this, id);
    stream->Ref();  // the registry's
    open_.emplace(id, stream);
    open = static_cast<int64_t>(open_.size());
  }
  if (observer_.streams) observer_.streams(open);
  return stream;
}

TokenStream* TokenStreams::Find(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = open_.find(id);
  if (it == open_.end()) return nullptr;
  it->second->Ref();
  return it->second;
}

void TokenStreams::FlushAll() {
  std::vector<TokenStream*> streams;
  {
    absl::MutexLock lock(&mu_);
    if (open_.empty()) return;
    streams.reserve(open_.size());
    for (auto& [id, stream] : open_) {
      stream->Ref();
      streams.push_back(stream);
    }
  }
  for (TokenStream* stream : streams) {
    stream->Flush();
    stream->Unref();
  }
}

void TokenStreams::Close() {
  std::vector<TokenStream*> streams;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    for (auto& [id, stream] : open_) {
      stream->Ref();
      streams.push_back(stream);
    }
  }
  for (TokenStream* stream : streams) {
    stream->Close();
    stream->Unref();
  }
}

void TokenStreams::Remove(TokenStream* stream) {
  int64_t open = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = open_.find(stream->id());
    if (it == open_.end() || it->second != stream) return;
    open_.erase(it);
    open = static_cast<int64_t>(open_.size());
  }
  if (observer_.streams) observer_.streams(open);
  stream->Unref();  // the registry's
}

void TokenStreams::Written(int64_t chunks) {
  if (observer_.message) observer_.message(chunks);
}

}  // namespace ferry
