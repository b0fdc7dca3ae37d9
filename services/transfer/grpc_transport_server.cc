// The server half of the gRPC transport (grpc_transport_internal.h): ferry.v1.KvTransfer over the
// transport's registered memory.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/transfer.grpc.pb.h"
#include "ferry/v1/transfer.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/server_callback.h"
#include "services/common/grpc_status.h"
#include "services/common/shared_token.h"
#include "services/transfer/grpc_transport_internal.h"

namespace ferry {
namespace transfer {
namespace grpc_internal {
namespace {

// --- The server side: reactors ---

// A put: applies each chunk to the region its key names, then tells the owner's await.
class WriteReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  WriteReactor(GrpcTransport* transport, grpc::CallbackServerContext* context,
               grpc::ByteBuffer* response)
      : transport_(transport), context_(context), response_(response) {
    transport_->ReactorStarted();
    const auto& metadata = context->client_metadata();
    if (auto it = metadata.find(kPutBytesMetadataKey); it != metadata.end()) {
      if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                            &expected_bytes_)) {
        expected_bytes_ = -1;
      }
    }
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed, or the stream broke.
      End(absl::OkStatus());
      return;
    }
    absl::Status applied = Apply();
    if (!applied.ok()) {
      End(std::move(applied));
      return;
    }
    StartRead(&message_);
  }

  void OnDone() override {
    transport_->ReactorDone();
    delete this;
  }

 private:
  // Copies the chunk's data into the region, straight from the gRPC buffer.
  absl::Status Apply() {
    grpc::ProtoBufferReader reader(&message_);
    CodedInputStream in(&reader);
    WriteChunkHead head;
    absl::Status status = ParseWriteChunkHead(in, &head);
    if (!status.ok()) return status;
    if (head.data_bytes > message_.Length()) {
      return absl::InvalidArgumentError("TransferWriteChunk shorter than its data");
    }
    if (first_) {
      first_ = false;
      key_ = std::move(head.key);
      transfer_id_ = std::move(head.transfer_id);
    } else if (head.has_key || head.has_transfer_id) {
      return absl::InvalidArgumentError("only the first chunk of a put carries its key and id");
    }
    absl::StatusOr<Region*> region =
        transport_->PinRange(key_, head.remote_address, head.data_bytes);
    key_accepted_ =
        key_accepted_ || region.ok() || region.status().code() == absl::StatusCode::kOutOfRange;
    if (!region.ok()) return region.status();
    const bool copied =
        in.ReadRaw(reinterpret_cast<void*>(head.remote_address), static_cast<int>(head.data_bytes));
    transport_->Unpin(*region);
    if (!copied || !AtEnd(in)) return absl::InvalidArgumentError("malformed TransferWriteChunk");
    bytes_ += head.data_bytes;
    return absl::OkStatus();
  }

  void End(absl::Status status) {
    if (status.ok() &&
        (context_->IsCancelled() ||
         (expected_bytes_ >= 0 && bytes_ != static_cast<uint64_t>(expected_bytes_)))) {
      status =
          absl::AbortedError(absl::StrCat("the initiator's stream broke after ", bytes_, " bytes"));
    }
    // Only a caller holding one of our keys may tell the owner anything.
    if (key_accepted_ && !transfer_id_.empty()) transport_->board().Deliver(transfer_id_, status);
    if (status.ok()) {
      v1::TransferWriteResponse response;
      response.set_bytes_written(bytes_);
      *response_ = Encode(response);
    }
    Finish(ToGrpcStatus(status));
  }

  GrpcTransport* const transport_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;
  grpc::ByteBuffer message_;
  int64_t expected_bytes_ = -1;
  bool first_ = true;
  bool key_accepted_ = false;
  std::string key_;
  std::string transfer_id_;
  uint64_t bytes_ = 0;
};

// A get: streams the requested ranges, in order, one chunk at a time.
class ReadReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ReadReactor(GrpcTransport* transport, const grpc::ByteBuffer* request) : transport_(transport) {
    transport_->ReactorStarted();
    absl::Status valid = Validate(request);
    if (!valid.ok()) {
      Finish(ToGrpcStatus(valid));
      return;
    }
    chunk_bytes_ = request_.max_chunk_bytes();
    if (chunk_bytes_ == 0 || chunk_bytes_ > transport_->chunk_bytes()) {
      chunk_bytes_ = transport_->chunk_bytes();
    }
    WriteNext();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the initiator's stream broke"));
      return;
    }
    WriteNext();
  }

  void OnDone() override {
    transport_->ReactorDone();
    delete this;
  }

 private:
  absl::Status Validate(const grpc::ByteBuffer* request) {
    grpc::ByteBuffer copy(*request);
    if (!Decode(&copy, &request_)) {
      return absl::InvalidArgumentError("malformed TransferReadRequest");
    }
    const int n = request_.ranges_size();
    if (n == 0 || static_cast<size_t>(n) > kMaxSegmentsPerTransfer) {
      return absl::InvalidArgumentError(
          absl::StrCat("a read names 1 to ", kMaxSegmentsPerTransfer, " ranges, not ", n));
    }
    // Every range is checked before the first byte goes out.
    for (const v1::TransferRange& range : request_.ranges()) {
      if (range.length() == 0) return absl::InvalidArgumentError("a read range has length 0");
      absl::StatusOr<Region*> region =
          transport_->PinRange(request_.remote_key(), range.remote_address(), range.length());
      if (!region.ok()) return region.status();
      transport_->Unpin(*region);
    }
    return absl::OkStatus();
  }

  // The next chunk, copied out of the region under a pin: a Deregister waits for one copy, not
  // for the stream, and the chunks after it fail.
  void WriteNext() {
    if (range_ == request_.ranges_size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const v1::TransferRange& range = request_.ranges(range_);
    const uint64_t length = std::min<uint64_t>(chunk_bytes_, range.length() - offset_);
    const uint64_t address = range.remote_address() + offset_;
    absl::StatusOr<Region*> region = transport_->PinRange(request_.remote_key(), address, length);
    if (!region.ok()) {
      Finish(ToGrpcStatus(region.status()));
      return;
    }
    v1::TransferReadChunk fields;
    fields.set_range_index(static_cast<uint32_t>(range_));
    fields.set_offset(offset_);
    message_ = EncodeWithData(fields, kReadDataTag, reinterpret_cast<const char*>(address), length);
    transport_->Unpin(*region);
    offset_ += length;
    if (offset_ == range.length()) {
      ++range_;
      offset_ = 0;
    }
    if (range_ == request_.ranges_size()) {
      StartWriteAndFinish(&message_, grpc::WriteOptions(), grpc::Status::OK);  // the last chunk
    } else {
      StartWrite(&message_);
    }
  }

  GrpcTransport* const transport_;
  v1::TransferReadRequest request_;
  uint64_t chunk_bytes_ = 0;
  int range_ = 0;
  uint64_t offset_ = 0;
  grpc::ByteBuffer message_;
};

// A call refused before it starts (a missing shared token): finishes with `status` at once.
template <typename Reactor>
class Refusal final : public Reactor {
 public:
  explicit Refusal(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* KvTransferService::Write(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  if (grpc::Status s = CheckSharedToken(*context, transport_->auth_token()); !s.ok()) {
    return new Refusal<grpc::ServerReadReactor<grpc::ByteBuffer>>(std::move(s));
  }
  return new WriteReactor(transport_, context, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvTransferService::Read(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  if (grpc::Status s = CheckSharedToken(*context, transport_->auth_token()); !s.ok()) {
    return new Refusal<grpc::ServerWriteReactor<grpc::ByteBuffer>>(std::move(s));
  }
  return new ReadReactor(transport_, request);
}

grpc::ServerUnaryReactor* KvTransferService::Notify(grpc::CallbackServerContext* context,
                                                    const v1::TransferNotifyRequest* request,
                                                    v1::TransferNotifyResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = CheckSharedToken(*context, transport_->auth_token()); !s.ok()) {
    reactor->Finish(std::move(s));
    return reactor;
  }
  if (request->transfer_id().empty() || request->transfer_id().size() > kMaxTransferIdBytes) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "a notification needs a transfer_id of 1 to 128 bytes"));
    return reactor;
  }
  if (!transport_->KnowsKey(request->remote_key())) {
    reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                                 "a notification must carry the key of a region registered here"));
    return reactor;
  }
  // google.rpc.Code, which absl::StatusCode follows; anything else is UNKNOWN.
  const int32_t code = request->code();
  absl::Status outcome;
  if (code != 0) {
    outcome = absl::Status(
        code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
        request->message());
  }
  transport_->board().Deliver(request->transfer_id(), std::move(outcome));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

void GrpcTransport::ReactorStarted() {
  absl::MutexLock lock(&reactors_mu_);
  ++reactors_;
}

void GrpcTransport::ReactorDone() {
  absl::MutexLock lock(&reactors_mu_);
  --reactors_;
}

}  // namespace grpc_internal
}  // namespace transfer
}  // namespace ferry
