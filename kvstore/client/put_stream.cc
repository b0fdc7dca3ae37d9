#include "kvstore/client/put_stream.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ferry {
namespace kv {

// The call's callbacks. It holds itself (self_) from the start until OnDone, so it outlives
// whichever of OnDone and the PutStream ends last. A hold keeps OnDone back until Finish, so the
// writes started from the caller's thread never race the call's end.
class PutStream::Reactor final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    broken_ = broken_ || !ok;
    cv_.SignalAll();
  }
  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    answered_ = ok;
  }
  void OnDone(const grpc::Status& status) override {
    // Destroyed last, after the lock below is released.
    std::shared_ptr<Reactor> keep = std::move(self_);
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
    cv_.SignalAll();
  }

  // Starts the write of `message` (alive until it completes) and waits for it.
  bool WriteAndWait(const grpc::ByteBuffer* message) {
    {
      absl::MutexLock lock(&mu_);
      if (broken_) return false;
      writing_ = true;
    }
    StartWrite(message);
    absl::MutexLock lock(&mu_);
    while (writing_) cv_.Wait(&mu_);
    return !broken_;
  }

  grpc::Status EndAndWait(ferry::v1::PutResponse* response) {
    bool broken;
    {
      absl::MutexLock lock(&mu_);
      broken = broken_;
    }
    if (!broken) StartWritesDone();
    RemoveHold();
    absl::MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    if (!status_.ok()) return status_;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (!answered_ || !response_.Dump(&slices).ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "Put: the node answered OK without a response");
    }
    for (const grpc::Slice& s : slices) {
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
    if (response != nullptr && !response->ParseFromString(bytes)) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "Put: the node's response does not parse");
    }
    return status_;
  }

  std::shared_ptr<Reactor> self_;  // set before the call starts; released by OnDone
  grpc::ByteBuffer response_;

 private:
  absl::Mutex mu_;
  absl::CondVar cv_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // a write failed: the call is ending
  bool answered_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

PutStream::PutStream(grpc::GenericStub* stub, grpc::ClientContext* context)
    : reactor_(std::make_shared<Reactor>()) {
  reactor_->self_ = reactor_;
  stub->PrepareBidiStreamingCall(context, "/ferry.v1.KvStore/Put", grpc::StubOptions(),
                                 reactor_.get());
  reactor_->StartRead(&reactor_->response_);
  reactor_->AddHold();
  reactor_->StartCall();
}

PutStream::~PutStream() {
  if (!finished_) Finish(nullptr);
}

bool PutStream::Write(const ferry::v1::PutChunk& chunk, absl::string_view data) {
  std::string head = chunk.SerializeAsString();
  std::vector<grpc::Slice> slices;
  if (!data.empty()) {
    // Field 4 (`data`), length-delimited: its tag and varint length, then the bytes in place.
    head.push_back(static_cast<char>((4 << 3) | 2));
    for (uint64_t n = data.size();;) {
      const auto low = static_cast<uint8_t>(n & 0x7f);
      n >>= 7;
      head.push_back(static_cast<char>(n != 0 ? (low | 0x80) : low));
      if (n == 0) break;
    }
  }
  slices.emplace_back(head);
  if (!data.empty()) {
    slices.emplace_back(data.data(), data.size(), grpc::Slice::STATIC_SLICE);
  }
  const grpc::ByteBuffer message(slices.data(), slices.size());
  return reactor_->WriteAndWait(&message);
}

grpc::Status PutStream::Finish(ferry::v1::PutResponse* response) {
  finished_ = true;
  return reactor_->EndAndWait(response);
}

}  // namespace kv
}  // namespace ferry
