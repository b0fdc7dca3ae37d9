// The client half of the gRPC transport (grpc_transport_internal.h): peers and the transfers
// posted to them.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/log.h"
#include "ferry/v1/transfer.grpc.pb.h"
#include "ferry/v1/transfer.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "services/common/grpc_status.h"
#include "services/common/shared_token.h"
#include "services/transfer/grpc_transport_internal.h"

namespace ferry {
namespace transfer {
namespace grpc_internal {
namespace {

// Connect's wait for the peer's server; a refused connection fails at once.
constexpr absl::Duration kConnectTimeout = absl::Seconds(2);
// The Notify that tells the owner the outcome of a get is best effort, and this short.
constexpr absl::Duration kNotifyTimeout = absl::Seconds(1);

constexpr char kWriteMethod[] = "/ferry.v1.KvTransfer/Write";
constexpr char kReadMethod[] = "/ferry.v1.KvTransfer/Read";

}  // namespace

// A worker thread's completion queue: it runs one call operation at a time and waits for it.
class CallQueue {
 public:
  ~CallQueue() {
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }
  grpc::CompletionQueue* cq() { return &cq_; }
  void* tag() { return this; }
  // Waits for the operation started with tag(); its success. Every operation completes, at the
  // latest when its call's deadline passes or the call is cancelled.
  bool Wait() {
    void* tag = nullptr;
    bool ok = false;
    CHECK(cq_.Next(&tag, &ok)) << "completion queue shut down under a call";
    return ok;
  }

 private:
  grpc::CompletionQueue cq_;
};

grpc::ChannelArguments GrpcTransport::ChannelArgs() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(message_limit_bytes_));
  args.SetMaxSendMessageSize(static_cast<int>(message_limit_bytes_));
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, static_cast<int>(stream_window_bytes_));
  // A connection of its own per peer: after a failure, Connect gets a fresh one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

// --- Peers ---

absl::StatusOr<PeerId> GrpcTransport::Connect(absl::string_view address) {
  absl::StatusOr<int> port = ParsePort(address);
  if (!port.ok()) return port.status();
  if (*port == 0) return absl::InvalidArgumentError(absl::StrCat("'", address, "' has port 0"));
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("KV transport is shutting down");
    auto it = peer_by_address_.find(address);
    if (it != peer_by_address_.end()) return it->second;
  }
  auto peer = std::make_shared<Peer>();
  peer->address = std::string(address);
  peer->channel =
      grpc::CreateCustomChannel(peer->address, grpc::InsecureChannelCredentials(), ChannelArgs());
  const auto deadline = absl::ToChronoTime(absl::Now() + kConnectTimeout);
  grpc_connectivity_state state = peer->channel->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) {
      return absl::UnavailableError(absl::StrCat("cannot connect to KV transport at ", address));
    }
    if (!peer->channel->WaitForStateChange(state, deadline)) {
      return absl::UnavailableError(absl::StrCat("KV transport at ", address, " did not answer in ",
                                                 absl::FormatDuration(kConnectTimeout)));
    }
    state = peer->channel->GetState(/*try_to_connect=*/true);
  }
  peer->generic_stub = std::make_unique<grpc::GenericStub>(peer->channel);
  peer->stub = v1::KvTransfer::NewStub(peer->channel);
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("KV transport is shutting down");
  // A concurrent Connect to the same address may have won.
  auto [it, inserted] = peer_by_address_.emplace(peer->address, 0);
  if (!inserted) return it->second;
  peer->id = next_peer_id_++;
  it->second = peer->id;
  peers_[peer->id] = std::move(peer);
  return it->second;
}

void GrpcTransport::Disconnect(PeerId peer_id) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(peer_id);
  if (it == peers_.end()) return;
  std::vector<TransferId> queued;
  for (auto& [id, entry] : transfers_) {
    if (entry.transfer->peer->id != peer_id) continue;
    if (entry.context != nullptr) entry.context->TryCancel();
    if (entry.notify_context != nullptr) entry.notify_context->TryCancel();
    if (entry.queued) queued.push_back(id);
  }
  for (TransferId id : queued) CompleteLater(id, absl::CancelledError("peer disconnected"));
  auto by_address = peer_by_address_.find(it->second->address);
  if (by_address != peer_by_address_.end() && by_address->second == peer_id) {
    peer_by_address_.erase(by_address);
  }
  failed_peers_.erase(peer_id);
  peers_.erase(it);
}

std::string GrpcTransport::PeerTransport(PeerId peer) const {
  absl::MutexLock lock(&mu_);
  return peers_.count(peer) != 0 ? std::string(kKind) : std::string();
}

// --- Transfers ---

absl::StatusOr<TransferId> GrpcTransport::Post(TransferRequest request, DoneCallback done) {
  absl::Status valid = ValidateTransferRequest(request);
  if (!valid.ok()) return valid;
  if (!LooksLikeKey(request.remote.remote_key)) {
    return absl::InvalidArgumentError("the remote key is not a gRPC KV transport key");
  }
  auto transfer = std::make_shared<TransferState>();
  transfer->request = std::move(request);
  transfer->done = std::move(done);
  transfer->posted = absl::Now();
  absl::Status local = AcquireLocalRegions(*transfer);
  if (!local.ok()) return local;

  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    auto peer = peers_.find(transfer->request.peer);
    if (stopping_) {
      refused = absl::UnavailableError("KV transport is shutting down");
    } else if (peer == peers_.end()) {
      refused = absl::NotFoundError(absl::StrCat("no peer ", transfer->request.peer));
    } else if (failed_peers_.count(transfer->request.peer) != 0) {
      refused = absl::UnavailableError(absl::StrCat("peer ", transfer->request.peer, " at ",
                                                    peer->second->address,
                                                    " failed; Connect again for a new connection"));
    } else {
      transfer->peer = peer->second;
      transfer->id = next_transfer_id_++;
      transfers_[transfer->id] = Entry{transfer};
      queue_.push_back(transfer->id);
      queued_deadlines_.emplace(transfer->request.deadline, transfer->id);
      return transfer->id;
    }
  }
  ReleaseLocalRegions(*transfer);
  return refused;
}

void GrpcTransport::Cancel(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return;
  if (it->second.context != nullptr) {
    it->second.context->TryCancel();
  } else if (it->second.queued) {
    CompleteLater(id, absl::CancelledError("transfer cancelled"));
  }
}

void GrpcTransport::CompleteLater(TransferId id, absl::Status status) {
  auto it = transfers_.find(id);
  if (it == transfers_.end() || !it->second.queued) return;
  Entry& entry = it->second;
  entry.queued = false;
  queue_.erase(std::find(queue_.begin(), queue_.end(), id));
  queued_deadlines_.erase({entry.transfer->request.deadline, id});
  unstarted_.emplace_back(entry.transfer, std::move(status));
}

void GrpcTransport::WorkerLoop() {
  CallQueue queue;
  while (true) {
    std::shared_ptr<TransferState> transfer;
    grpc::ClientContext context;
    absl::Status refused;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      Entry& entry = transfers_.at(queue_.front());
      queue_.pop_front();
      entry.queued = false;
      transfer = entry.transfer;
      queued_deadlines_.erase({transfer->request.deadline, transfer->id});
      if (failed_peers_.count(transfer->peer->id) != 0) {
        refused =
            absl::UnavailableError(absl::StrCat("peer at ", transfer->peer->address, " failed"));
      } else if (transfer->request.deadline <= absl::Now()) {
        refused = absl::DeadlineExceededError("transfer's deadline passed before it started");
      } else {
        entry.context = &context;
      }
    }
    if (!refused.ok()) {
      Complete(transfer, std::move(refused));
      continue;
    }
    context.set_deadline(absl::ToChronoTime(transfer->request.deadline));
    AttachSharedToken(&context, options_.auth_token);
    absl::Status status = transfer->request.op == TransferOp::kPut
                              ? RunPut(*transfer, &context, queue)
                              : RunGet(*transfer, &context, queue);
    {
      absl::MutexLock lock(&mu_);
      transfers_.at(transfer->id).context = nullptr;
    }
    if (transfer->request.op == TransferOp::kGet && !transfer->request.transfer_id.empty()) {
      NotifyOwner(*transfer, status);
    }
    Complete(transfer, std::move(status));
  }
}

absl::Status GrpcTransport::RunPut(TransferState& transfer, grpc::ClientContext* context,
                                   CallQueue& queue) {
  const TransferRequest& request = transfer.request;
  context->AddMetadata(kPutBytesMetadataKey, absl::StrCat(transfer.bytes));
  // The metadata goes out with the first message (starting the call is then no operation).
  context->set_initial_metadata_corked(true);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      transfer.peer->generic_stub->PrepareCall(context, kWriteMethod, queue.cq());
  if (call == nullptr) return absl::InternalError("gRPC could not set up the Write call");
  call->StartCall(nullptr);
  bool ok = true;
  // Only the first message carries the key and the transfer id.
  v1::TransferWriteChunk fields;
  fields.set_remote_key(request.remote.remote_key);
  fields.set_transfer_id(request.transfer_id);
  for (size_t i = 0; i < request.segments.size() && ok; ++i) {
    const TransferSegment& s = request.segments[i];
    const char* local = reinterpret_cast<const char*>(s.local_address);
    for (uint64_t offset = 0; offset < s.length && ok;) {
      const uint64_t n = std::min<uint64_t>(options_.grpc_chunk_bytes, s.length - offset);
      fields.set_remote_address(s.remote_address + offset);
      const grpc::ByteBuffer message = EncodeWithData(fields, kWriteDataTag, local + offset, n);
      offset += n;
      if (i + 1 == request.segments.size() && offset == s.length) {
        call->WriteLast(message, grpc::WriteOptions(), queue.tag());  // with the half-close
      } else {
        call->Write(message, queue.tag());
      }
      ok = queue.Wait();
      fields.clear_remote_key();
      fields.clear_transfer_id();
    }
  }
  // The local memory is not touched from here on.
  grpc::ByteBuffer response_buffer;
  if (ok) {
    call->Read(&response_buffer, queue.tag());
    ok = queue.Wait();
  }
  grpc::Status status;
  call->Finish(&status, queue.tag());
  queue.Wait();
  if (!status.ok()) return FromGrpcStatus(status);
  v1::TransferWriteResponse response;
  if (!ok || !Decode(&response_buffer, &response) || response.bytes_written() != transfer.bytes) {
    return absl::DataLossError(
        absl::StrCat("peer took ", response.bytes_written(), " of ", transfer.bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status GrpcTransport::RunGet(TransferState& transfer, grpc::ClientContext* context,
                                   CallQueue& queue) {
  const std::vector<TransferSegment>& segments = transfer.request.segments;
  grpc::ByteBuffer request_buffer;
  {
    v1::TransferReadRequest request;
    request.set_remote_key(transfer.request.remote.remote_key);
    request.set_max_chunk_bytes(static_cast<uint32_t>(options_.grpc_chunk_bytes));
    request.mutable_ranges()->Reserve(static_cast<int>(segments.size()));
    for (const TransferSegment& s : segments) {
      v1::TransferRange* range = request.add_ranges();
      range->set_remote_address(s.remote_address);
      range->set_length(s.length);
    }
    request_buffer = Encode(request);
  }
  // The metadata goes out with the request (starting the call is then no operation).
  context->set_initial_metadata_corked(true);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      transfer.peer->generic_stub->PrepareCall(context, kReadMethod, queue.cq());
  if (call == nullptr) return absl::InternalError("gRPC could not set up the Read call");
  call->StartCall(nullptr);
  call->WriteLast(request_buffer, grpc::WriteOptions(), queue.tag());
  bool ok = queue.Wait();
  // The target sends the ranges in order: the chunk expected next starts at (index, offset).
  size_t index = 0;
  uint64_t offset = 0;
  absl::Status bad_chunk;
  grpc::ByteBuffer message;
  while (ok) {
    call->Read(&message, queue.tag());
    if (!queue.Wait()) break;
    grpc::ProtoBufferReader reader(&message);
    CodedInputStream in(&reader);
    ReadChunkHead head;
    bad_chunk = ParseReadChunkHead(in, &head);
    if (bad_chunk.ok() && head.data_bytes > message.Length()) {
      bad_chunk = absl::DataLossError("TransferReadChunk shorter than its data");
    }
    if (bad_chunk.ok() &&
        (index == segments.size() || head.range_index != index || head.offset != offset ||
         head.data_bytes == 0 || head.data_bytes > segments[index].length - offset)) {
      bad_chunk = absl::DataLossError(absl::StrCat(
          "peer sent ", head.data_bytes, " bytes for range ", head.range_index, " at offset ",
          head.offset, "; expected range ", index, " at offset ", offset));
    }
    // Straight from the gRPC buffer into the segment, which the checks above bound.
    if (bad_chunk.ok() &&
        (!in.ReadRaw(reinterpret_cast<char*>(segments[index].local_address) + offset,
                     static_cast<int>(head.data_bytes)) ||
         !AtEnd(in))) {
      bad_chunk = absl::DataLossError("malformed TransferReadChunk");
    }
    if (!bad_chunk.ok()) {
      context->TryCancel();
      break;
    }
    offset += head.data_bytes;
    if (offset == segments[index].length) {
      ++index;
      offset = 0;
    }
  }
  grpc::Status status;
  call->Finish(&status, queue.tag());
  queue.Wait();
  if (!bad_chunk.ok()) return bad_chunk;
  if (!status.ok()) return FromGrpcStatus(status);
  if (index != segments.size()) {
    return absl::DataLossError(absl::StrCat("peer's stream ended in range ", index, " of ",
                                            segments.size(), " at offset ", offset));
  }
  return absl::OkStatus();
}

void GrpcTransport::NotifyOwner(const TransferState& transfer, const absl::Status& status) {
  // An unreachable peer cannot be told.
  if (status.code() == absl::StatusCode::kUnavailable) return;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kNotifyTimeout));
  AttachSharedToken(&context, options_.auth_token);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    transfers_.at(transfer.id).notify_context = &context;
  }
  v1::TransferNotifyRequest request;
  request.set_transfer_id(transfer.request.transfer_id);
  request.set_remote_key(transfer.request.remote.remote_key);
  request.set_code(static_cast<int32_t>(status.code()));
  request.set_message(std::string(status.message()));
  v1::TransferNotifyResponse response;
  const grpc::Status sent = transfer.peer->stub->Notify(&context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    transfers_.at(transfer.id).notify_context = nullptr;
  }
  if (!sent.ok()) {
    LOG(WARNING) << "could not tell the KV transport at " << transfer.peer->address
                 << " the outcome of transfer '" << transfer.request.transfer_id
                 << "': " << FromGrpcStatus(sent);
  }
}

void GrpcTransport::Complete(const std::shared_ptr<TransferState>& transfer, absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    transfers_.erase(transfer->id);
    if (status.code() == absl::StatusCode::kUnavailable && peers_.count(transfer->peer->id) != 0) {
      failed_peers_.insert(transfer->peer->id);
      auto it = peer_by_address_.find(transfer->peer->address);
      if (it != peer_by_address_.end() && it->second == transfer->peer->id) {
        peer_by_address_.erase(it);
      }
    }
  }
  ReleaseLocalRegions(*transfer);
  metrics_.RecordTransfer(kKind, transfer->request.op, transfer->bytes,
                          absl::Now() - transfer->posted, status);
  DoneCallback done = std::move(transfer->done);
  done(std::move(status));
}

void GrpcTransport::CompletionLoop() {
  mu_.Lock();
  while (true) {
    // Queued transfers whose deadline passed complete now, not when a worker frees up.
    const absl::Time now = absl::Now();
    while (!queued_deadlines_.empty() && queued_deadlines_.begin()->first <= now) {
      CompleteLater(queued_deadlines_.begin()->second,
                    absl::DeadlineExceededError("transfer's deadline passed in the queue"));
    }
    if (!unstarted_.empty()) {
      std::vector<std::pair<std::shared_ptr<TransferState>, absl::Status>> unstarted;
      unstarted.swap(unstarted_);
      mu_.Unlock();
      for (auto& [transfer, status] : unstarted) Complete(transfer, std::move(status));
      mu_.Lock();
      continue;
    }
    if (stopping_ && queue_.empty()) break;
    const absl::Time next =
        queued_deadlines_.empty() ? absl::InfiniteFuture() : queued_deadlines_.begin()->first;
    auto wake = [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !unstarted_.empty() ||
             (!queued_deadlines_.empty() && queued_deadlines_.begin()->first < next);
    };
    mu_.AwaitWithDeadline(absl::Condition(&wake), next);
  }
  mu_.Unlock();
}

}  // namespace grpc_internal
}  // namespace transfer
}  // namespace ferry
