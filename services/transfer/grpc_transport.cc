#include "services/transfer/grpc_transport.h"

#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/strings/numbers.h"
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
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/server_callback.h"
#include "services/common/grpc_status.h"
#include "services/common/shared_token.h"
#include "services/transfer/notification_board.h"
#include "services/transfer/transfer_metrics.h"

namespace ferry {
namespace transfer {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

constexpr absl::string_view kKind = "grpc";

// Threads that run the calls of posted transfers; more transfers wait in a queue.
constexpr int kWorkerThreads = 4;
// Connect's wait for the peer's server; a refused connection fails at once.
constexpr absl::Duration kConnectTimeout = absl::Seconds(2);
// The Notify that tells the owner the outcome of a get is best effort, and this short.
constexpr absl::Duration kNotifyTimeout = absl::Seconds(1);
// What the destructor gives peers' calls into this transport's memory before cancelling them.
constexpr absl::Duration kShutdownGrace = absl::Milliseconds(100);

// Chunk sizes accepted by Create; every message stays far below gRPC's 2 GiB limit.
constexpr size_t kMaxChunkBytes = size_t{256} << 20;
// A peer may use a larger chunk than this transport; accept messages of at least this size.
constexpr size_t kMinMessageLimitBytes = size_t{64} << 20;
// Room for the fields around a chunk's data in a message.
constexpr size_t kMessageOverheadBytes = size_t{64} << 10;
// The HTTP/2 flow-control window of a stream, fixed (no BDP probing): a few chunks in flight
// keep loopback and LAN links busy; probing from 64 KiB up costs CPU and round trips.
constexpr size_t kMinStreamWindowBytes = size_t{4} << 20;
constexpr size_t kMaxStreamWindowBytes = size_t{64} << 20;

constexpr char kWriteMethod[] = "/ferry.v1.KvTransfer/Write";
constexpr char kReadMethod[] = "/ferry.v1.KvTransfer/Read";

// A remote key: magic, the region id (little endian) and random bytes that make it unguessable.
constexpr char kKeyMagic[] = {'F', 'g', 'k', '1'};
constexpr size_t kKeyIdOffset = sizeof(kKeyMagic);
constexpr size_t kKeyRandomBytes = 16;
constexpr size_t kKeyBytes = kKeyIdOffset + sizeof(uint64_t) + kKeyRandomBytes;

// Metadata on a put's Write call: the bytes the stream will carry. It lets the target tell a
// stream that ended after its last byte from one that broke (a cancelled stream's last read
// fails just like a half-closed one's).
constexpr char kPutBytesMetadataKey[] = "x-ferry-kv-put-bytes";

// --- Wire ---
//
// The data-carrying messages (TransferWriteChunk, TransferReadChunk) are encoded and decoded here
// rather than by protobuf, so that the data is copied once on each side: from local memory into
// the outgoing gRPC buffer, and from the incoming gRPC buffer into memory. An encoded message is
// its other fields, serialized by protobuf, followed by the data field (the wire format allows
// fields in any order; protobuf itself writes them by number, so data comes last either way).
// The decoders accept exactly that: known fields, data last.

constexpr uint32_t kVarintWireType = 0;
constexpr uint32_t kBytesWireType = 2;
constexpr uint32_t Tag(int field, uint32_t wire_type) {
  return static_cast<uint32_t>(field) << 3 | wire_type;
}

constexpr uint32_t kWriteKeyTag =
    Tag(v1::TransferWriteChunk::kRemoteKeyFieldNumber, kBytesWireType);
constexpr uint32_t kWriteTransferIdTag =
    Tag(v1::TransferWriteChunk::kTransferIdFieldNumber, kBytesWireType);
constexpr uint32_t kWriteAddressTag =
    Tag(v1::TransferWriteChunk::kRemoteAddressFieldNumber, kVarintWireType);
constexpr uint32_t kWriteDataTag = Tag(v1::TransferWriteChunk::kDataFieldNumber, kBytesWireType);
constexpr uint32_t kReadRangeIndexTag =
    Tag(v1::TransferReadChunk::kRangeIndexFieldNumber, kVarintWireType);
constexpr uint32_t kReadOffsetTag = Tag(v1::TransferReadChunk::kOffsetFieldNumber, kVarintWireType);
constexpr uint32_t kReadDataTag = Tag(v1::TransferReadChunk::kDataFieldNumber, kBytesWireType);
static_assert(v1::TransferWriteChunk::kDataFieldNumber >
                      v1::TransferWriteChunk::kRemoteKeyFieldNumber &&
                  v1::TransferWriteChunk::kDataFieldNumber >
                      v1::TransferWriteChunk::kTransferIdFieldNumber &&
                  v1::TransferWriteChunk::kDataFieldNumber >
                      v1::TransferWriteChunk::kRemoteAddressFieldNumber,
              "data must be the last field");
static_assert(v1::TransferReadChunk::kDataFieldNumber >
                      v1::TransferReadChunk::kRangeIndexFieldNumber &&
                  v1::TransferReadChunk::kDataFieldNumber >
                      v1::TransferReadChunk::kOffsetFieldNumber,
              "data must be the last field");

// `fields` serialized, then the bytes field `data_tag` holding [data, data + n), in one buffer.
grpc::ByteBuffer EncodeWithData(const google::protobuf::MessageLite& fields, uint32_t data_tag,
                                const char* data, size_t n) {
  const size_t fields_bytes = fields.ByteSizeLong();
  const size_t bytes = fields_bytes + CodedOutputStream::VarintSize32(data_tag) +
                       CodedOutputStream::VarintSize64(n) + n;
  grpc_slice slice = grpc_slice_malloc(bytes);
  uint8_t* p = GRPC_SLICE_START_PTR(slice);
  p = fields.SerializeWithCachedSizesToArray(p);
  p = CodedOutputStream::WriteTagToArray(data_tag, p);
  p = CodedOutputStream::WriteVarint64ToArray(n, p);
  std::memcpy(p, data, n);
  grpc::Slice owned(slice, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&owned, 1);
}

grpc::ByteBuffer Encode(const google::protobuf::MessageLite& message) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

bool Decode(grpc::ByteBuffer* buffer, google::protobuf::MessageLite* message) {
  grpc::ProtoBufferReader reader(buffer);
  return reader.status().ok() && message->ParseFromZeroCopyStream(&reader);
}

// Reads a bytes field's value of at most `max_bytes`.
bool ReadBytesField(CodedInputStream& in, uint32_t max_bytes, std::string* value) {
  uint32_t length = 0;
  return in.ReadVarint32(&length) && length <= max_bytes &&
         in.ReadString(value, static_cast<int>(length));
}

// The fields of a TransferWriteChunk before its data; the stream is left at the data.
struct WriteChunkHead {
  bool has_key = false;
  std::string key;
  bool has_transfer_id = false;
  std::string transfer_id;
  uint64_t remote_address = 0;
  uint32_t data_bytes = 0;
};

absl::Status ParseWriteChunkHead(CodedInputStream& in, WriteChunkHead* head) {
  while (true) {
    const uint32_t tag = in.ReadTag();
    switch (tag) {
      case 0:
        if (!in.ConsumedEntireMessage()) break;
        return absl::OkStatus();  // no data field: an empty chunk
      case kWriteKeyTag:
        head->has_key = true;
        if (!ReadBytesField(in, 2 * kKeyBytes, &head->key)) break;
        continue;
      case kWriteTransferIdTag:
        head->has_transfer_id = true;
        if (!ReadBytesField(in, kMaxTransferIdBytes, &head->transfer_id)) break;
        continue;
      case kWriteAddressTag:
        if (!in.ReadVarint64(&head->remote_address)) break;
        continue;
      case kWriteDataTag:
        if (!in.ReadVarint32(&head->data_bytes)) break;
        return absl::OkStatus();
      default:
        break;
    }
    return absl::InvalidArgumentError("malformed TransferWriteChunk");
  }
}

// The fields of a TransferReadChunk before its data; the stream is left at the data.
struct ReadChunkHead {
  uint64_t range_index = 0;
  uint64_t offset = 0;
  uint32_t data_bytes = 0;
};

absl::Status ParseReadChunkHead(CodedInputStream& in, ReadChunkHead* head) {
  while (true) {
    const uint32_t tag = in.ReadTag();
    switch (tag) {
      case kReadRangeIndexTag:
        if (!in.ReadVarint64(&head->range_index)) break;
        continue;
      case kReadOffsetTag:
        if (!in.ReadVarint64(&head->offset)) break;
        continue;
      case kReadDataTag:
        if (!in.ReadVarint32(&head->data_bytes)) break;
        return absl::OkStatus();
      default:  // including the end of a chunk without data, which the target never sends
        break;
    }
    return absl::DataLossError("malformed TransferReadChunk");
  }
}

// After the data: nothing may follow.
bool AtEnd(CodedInputStream& in) { return in.ReadTag() == 0 && in.ConsumedEntireMessage(); }

// --- Keys and addresses ---

bool LooksLikeKey(absl::string_view key) {
  return key.size() == kKeyBytes && key.substr(0, kKeyIdOffset) == absl::string_view(kKeyMagic, 4);
}

RegionId KeyRegionId(absl::string_view key) {
  uint64_t id = 0;
  for (size_t i = 0; i < sizeof(id); ++i) {
    id |= uint64_t{static_cast<uint8_t>(key[kKeyIdOffset + i])} << (8 * i);
  }
  return id;
}

// Compares keys without stopping at the first difference, so timing says nothing of the token.
bool SameKey(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// Checks "host:port" ("[v6 address]:port" too) and returns the port.
absl::StatusOr<int> ParsePort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not a host:port gRPC transport address"));
  }
  const absl::string_view host = address.substr(0, colon);
  const bool bracketed = host.front() == '[';
  if (bracketed ? host.size() < 3 || host.back() != ']'
                : host.find_first_of("[]:") != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' has a malformed host"));
  }
  const absl::string_view port_text = address.substr(colon + 1);
  int port = 0;
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", address, "' has a malformed port"));
  }
  return port;
}

// --- State ---

// A region registered here.
struct Region {
  RegionId id = 0;
  char* base = nullptr;
  size_t length = 0;
  std::string key;
  // Allocate: the mapping's length (munmap'd when the region ends); 0 for caller memory.
  size_t mapped_bytes = 0;
  // Server-side copies into or out of the region in progress.
  int pins = 0;
  // Transfers posted here whose local memory lies in the region.
  int local_uses = 0;
  // Deregister has begun: no new access; the entry goes once pins reach 0.
  bool removed = false;
};

struct Peer {
  PeerId id = 0;
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  // Write and Read, with the messages encoded here; Notify through the generated stub.
  std::unique_ptr<grpc::GenericStub> generic_stub;
  std::unique_ptr<v1::KvTransfer::Stub> stub;
};

struct TransferState {
  TransferId id = 0;
  std::shared_ptr<Peer> peer;
  TransferRequest request;
  DoneCallback done;
  // Regions of the local memory (local_uses counted), released before `done` runs.
  std::vector<Region*> local_regions;
  uint64_t bytes = 0;
  absl::Time posted;
};

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

class GrpcTransport;

// ferry.v1.KvTransfer over the transport's registered memory, on gRPC's callback API (no thread
// per call); Write and Read take their messages raw (see "Wire" above).
class KvTransferService final
    : public v1::KvTransfer::WithRawCallbackMethod_Write<v1::KvTransfer::WithRawCallbackMethod_Read<
          v1::KvTransfer::WithCallbackMethod_Notify<v1::KvTransfer::Service>>> {
 public:
  explicit KvTransferService(GrpcTransport* transport) : transport_(transport) {}
  grpc::ServerReadReactor<grpc::ByteBuffer>* Write(grpc::CallbackServerContext* context,
                                                   grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Read(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Notify(grpc::CallbackServerContext* context,
                                   const v1::TransferNotifyRequest* request,
                                   v1::TransferNotifyResponse* response) override;

 private:
  GrpcTransport* const transport_;
};

// Thread-safe. Three locks, never nested: regions_mu_ (registrations, pins), mu_ (peers,
// transfers, threads) and reactors_mu_. Callbacks run on the worker and completion threads with
// none held.
class GrpcTransport final : public KvTransport {
 public:
  explicit GrpcTransport(const TransportOptions& options);
  ~GrpcTransport() override;

  absl::Status Start();

  absl::string_view kind() const override { return kKind; }
  std::string address() const override { return address_; }

  absl::StatusOr<LocalRegion> Register(MemorySpan span) override;
  absl::StatusOr<LocalRegion> Allocate(size_t bytes) override;
  absl::Status Deregister(RegionId id) override;
  int64_t registered_regions() const override;

  absl::StatusOr<PeerId> Connect(absl::string_view address) override;
  void Disconnect(PeerId peer) override;
  std::string PeerTransport(PeerId peer) const override;

  absl::StatusOr<TransferId> Post(TransferRequest request, DoneCallback done) override;
  void Cancel(TransferId id) override;

  void AwaitNotification(const std::string& transfer_id, absl::Time deadline,
                         DoneCallback done) override {
    board_.Await(transfer_id, deadline, std::move(done));
  }

  // For the server side.
  size_t chunk_bytes() const { return options_.grpc_chunk_bytes; }
  const std::string& auth_token() const { return options_.auth_token; }
  NotificationBoard& board() { return board_; }
  // The live region `key` names with [address, address + length) inside it, pinned: Unpin it
  // after the copy. PermissionDenied for a key that names no live region, OutOfRange for a range
  // outside it.
  absl::StatusOr<Region*> PinRange(absl::string_view key, uint64_t address, uint64_t length);
  // Whether `key` names a live region of this transport.
  bool KnowsKey(absl::string_view key);
  void Unpin(Region* region);
  // Reactors (server calls) alive; the destructor waits for none.
  void ReactorStarted();
  void ReactorDone();

 private:
  // A transfer's progress, guarded by mu_.
  struct Entry {
    std::shared_ptr<TransferState> transfer;
    bool queued = true;
    // The running call, for Cancel, Disconnect and the destructor; null while queued.
    grpc::ClientContext* context = nullptr;
    // The Notify telling the owner a get's outcome, for Disconnect and the destructor.
    grpc::ClientContext* notify_context = nullptr;
  };

  grpc::ChannelArguments ChannelArgs() const;
  absl::StatusOr<LocalRegion> AddRegion(char* base, size_t length, size_t mapped_bytes);
  void PublishRegistered() ABSL_EXCLUSIVE_LOCKS_REQUIRED(regions_mu_);
  // Counts the transfer's local regions in use (InvalidArgument if a segment is outside them).
  absl::Status AcquireLocalRegions(TransferState& transfer);
  void ReleaseLocalRegions(const TransferState& transfer);

  void WorkerLoop();
  void CompletionLoop();
  absl::Status RunPut(TransferState& transfer, grpc::ClientContext* context, CallQueue& queue);
  absl::Status RunGet(TransferState& transfer, grpc::ClientContext* context, CallQueue& queue);
  void NotifyOwner(const TransferState& transfer, const absl::Status& status);
  // Hands a queued transfer that will not start to the completion thread.
  void CompleteLater(TransferId id, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the transfer: forgets it, releases its regions, records it, runs its callback.
  void Complete(const std::shared_ptr<TransferState>& transfer, absl::Status status);

  const TransportOptions options_;
  const size_t message_limit_bytes_;
  const size_t stream_window_bytes_;
  TransferMetrics metrics_;
  NotificationBoard board_;
  KvTransferService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  mutable absl::Mutex regions_mu_;
  std::map<RegionId, std::unique_ptr<Region>> regions_ ABSL_GUARDED_BY(regions_mu_);
  // The live regions (not being removed) by base address; they do not overlap.
  std::map<uint64_t, Region*> by_address_ ABSL_GUARDED_BY(regions_mu_);
  RegionId next_region_id_ ABSL_GUARDED_BY(regions_mu_) = 1;
  int64_t live_regions_ ABSL_GUARDED_BY(regions_mu_) = 0;
  uint64_t live_bytes_ ABSL_GUARDED_BY(regions_mu_) = 0;
  absl::BitGen bitgen_ ABSL_GUARDED_BY(regions_mu_);

  absl::Mutex reactors_mu_;
  int64_t reactors_ ABSL_GUARDED_BY(reactors_mu_) = 0;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<PeerId, std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  // Live (not failed) peers by address.
  std::map<std::string, PeerId, std::less<>> peer_by_address_ ABSL_GUARDED_BY(mu_);
  std::set<PeerId> failed_peers_ ABSL_GUARDED_BY(mu_);
  PeerId next_peer_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::unordered_map<TransferId, Entry> transfers_ ABSL_GUARDED_BY(mu_);
  std::deque<TransferId> queue_ ABSL_GUARDED_BY(mu_);
  // The deadlines of the queued transfers, for the completion thread.
  std::set<std::pair<absl::Time, TransferId>> queued_deadlines_ ABSL_GUARDED_BY(mu_);
  // Transfers that end without starting (cancelled, deadline passed in the queue, shutdown).
  std::vector<std::pair<std::shared_ptr<TransferState>, absl::Status>> unstarted_
      ABSL_GUARDED_BY(mu_);
  TransferId next_transfer_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::thread> workers_;
  std::thread completion_thread_;
};

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

// --- GrpcTransport ---

GrpcTransport::GrpcTransport(const TransportOptions& options)
    : options_(options),
      message_limit_bytes_(std::max(options.grpc_chunk_bytes, kMinMessageLimitBytes) +
                           kMessageOverheadBytes),
      stream_window_bytes_(
          std::clamp(4 * options.grpc_chunk_bytes, kMinStreamWindowBytes, kMaxStreamWindowBytes)),
      metrics_(options.registry),
      board_(options.early_notification_ttl, options.max_early_notifications, &metrics_,
             std::string(kKind)),
      service_(this) {}

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

absl::Status GrpcTransport::Start() {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(message_limit_bytes_));
  builder.SetMaxSendMessageSize(static_cast<int>(message_limit_bytes_));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             static_cast<int>(stream_window_bytes_));
  // Refuse to share the port with another process.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("KV transport cannot serve gRPC on ",
                                               options_.listen_address,
                                               " (address in use or invalid?)"));
  }
  std::string host = options_.listen_address.substr(0, options_.listen_address.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") {
    // Listening everywhere: peers reach this host by its name (in Kubernetes, the pod's).
    char name[256] = {};
    host = gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0' ? name : "127.0.0.1";
  }
  address_ = absl::StrCat(host, ":", port);
  for (int i = 0; i < kWorkerThreads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  completion_thread_ = std::thread([this] { CompletionLoop(); });
  return absl::OkStatus();
}

GrpcTransport::~GrpcTransport() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, entry] : transfers_) {
      if (entry.context != nullptr) entry.context->TryCancel();
      if (entry.notify_context != nullptr) entry.notify_context->TryCancel();
    }
    while (!queue_.empty()) {
      CompleteLater(queue_.front(), absl::CancelledError("KV transport is shutting down"));
    }
  }
  if (server_ != nullptr) {
    // Peers' calls into our memory: cancelled after the grace.
    server_->Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
    server_->Wait();
    // Cancelled reactors finish at once; none may outlive the transport.
    absl::MutexLock lock(&reactors_mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(reactors_mu_) { return reactors_ == 0; };
    while (!reactors_mu_.AwaitWithTimeout(absl::Condition(&none), absl::Seconds(5))) {
      LOG(WARNING) << "KV transport: waiting for " << reactors_ << " server calls to end";
    }
  }
  for (std::thread& worker : workers_) worker.join();
  if (completion_thread_.joinable()) completion_thread_.join();
  board_.Shutdown();
  absl::MutexLock lock(&regions_mu_);
  for (auto& [id, region] : regions_) {
    if (region->mapped_bytes != 0) ::munmap(region->base, region->mapped_bytes);
  }
  regions_.clear();
  by_address_.clear();
  live_regions_ = 0;
  live_bytes_ = 0;
  PublishRegistered();
}

void GrpcTransport::ReactorStarted() {
  absl::MutexLock lock(&reactors_mu_);
  ++reactors_;
}

void GrpcTransport::ReactorDone() {
  absl::MutexLock lock(&reactors_mu_);
  --reactors_;
}

// --- Regions ---

absl::StatusOr<LocalRegion> GrpcTransport::AddRegion(char* base, size_t length,
                                                     size_t mapped_bytes) {
  absl::MutexLock lock(&regions_mu_);
  const auto begin = reinterpret_cast<uint64_t>(base);
  auto next = by_address_.lower_bound(begin);
  const bool overlaps_next = next != by_address_.end() && next->first - begin < length;
  const bool overlaps_previous = next != by_address_.begin() &&
                                 begin - std::prev(next)->first < std::prev(next)->second->length;
  if (overlaps_next || overlaps_previous) {
    return absl::AlreadyExistsError(
        absl::StrCat("[0x", absl::Hex(begin), ", 0x", absl::Hex(begin + length),
                     ") overlaps a region already registered with this transport"));
  }
  auto region = std::make_unique<Region>();
  region->id = next_region_id_++;
  region->base = base;
  region->length = length;
  region->mapped_bytes = mapped_bytes;
  region->key.assign(kKeyMagic, sizeof(kKeyMagic));
  for (size_t i = 0; i < sizeof(uint64_t); ++i) {
    region->key.push_back(static_cast<char>((region->id >> (8 * i)) & 0xff));
  }
  for (size_t i = 0; i < kKeyRandomBytes; i += sizeof(uint64_t)) {
    const uint64_t random = absl::Uniform<uint64_t>(bitgen_);
    for (size_t j = 0; j < sizeof(random); ++j) {
      region->key.push_back(static_cast<char>((random >> (8 * j)) & 0xff));
    }
  }
  LocalRegion result;
  result.id = region->id;
  result.span = MemorySpan{base, length};
  result.descriptor = RegionDescriptor{begin, length, region->key};
  by_address_[begin] = region.get();
  regions_[region->id] = std::move(region);
  ++live_regions_;
  live_bytes_ += length;
  PublishRegistered();
  return result;
}

void GrpcTransport::PublishRegistered() {
  metrics_.SetRegistered(kKind, live_regions_, live_bytes_);
}

absl::StatusOr<LocalRegion> GrpcTransport::Register(MemorySpan span) {
  const auto begin = reinterpret_cast<uintptr_t>(span.address);
  if (span.address == nullptr || span.length == 0) {
    return absl::InvalidArgumentError("cannot register an empty or null span");
  }
  if (begin + span.length < begin) {
    return absl::InvalidArgumentError("span wraps around the address space");
  }
  return AddRegion(static_cast<char*>(span.address), span.length, 0);
}

absl::StatusOr<LocalRegion> GrpcTransport::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("cannot allocate 0 bytes");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  if (bytes > SIZE_MAX - page) return absl::InvalidArgumentError("allocation too large");
  const size_t mapped = (bytes + page - 1) / page * page;
  void* base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", bytes, " bytes for the KV transport: ", std::strerror(errno)));
  }
  // Fails only if the caller registered memory it has since unmapped.
  absl::StatusOr<LocalRegion> region = AddRegion(static_cast<char*>(base), bytes, mapped);
  if (!region.ok()) ::munmap(base, mapped);
  return region;
}

absl::Status GrpcTransport::Deregister(RegionId id) {
  std::unique_ptr<Region> region;
  {
    absl::MutexLock lock(&regions_mu_);
    auto it = regions_.find(id);
    if (it == regions_.end() || it->second->removed) {
      return absl::NotFoundError(absl::StrCat("no region ", id, " is registered"));
    }
    Region* r = it->second.get();
    if (r->local_uses > 0) {
      return absl::FailedPreconditionError(absl::StrCat("region ", id, " is the local memory of ",
                                                        r->local_uses, " transfer(s) in progress"));
    }
    // No new access from now on; copies in progress take microseconds.
    r->removed = true;
    by_address_.erase(reinterpret_cast<uint64_t>(r->base));
    --live_regions_;
    live_bytes_ -= r->length;
    PublishRegistered();
    regions_mu_.Await(absl::Condition(
        +[](Region* pinned) { return pinned->pins == 0; }, r));
    region = std::move(regions_.find(id)->second);
    regions_.erase(id);
  }
  if (region->mapped_bytes != 0) ::munmap(region->base, region->mapped_bytes);
  return absl::OkStatus();
}

int64_t GrpcTransport::registered_regions() const {
  absl::MutexLock lock(&regions_mu_);
  return live_regions_;
}

absl::StatusOr<Region*> GrpcTransport::PinRange(absl::string_view key, uint64_t address,
                                                uint64_t length) {
  absl::MutexLock lock(&regions_mu_);
  if (!LooksLikeKey(key)) {
    return absl::PermissionDeniedError("the remote key is not a key of this KV transport");
  }
  auto it = regions_.find(KeyRegionId(key));
  if (it == regions_.end() || it->second->removed || !SameKey(key, it->second->key)) {
    return absl::PermissionDeniedError("the remote key names no region registered here");
  }
  Region* region = it->second.get();
  const auto begin = reinterpret_cast<uint64_t>(region->base);
  if (address < begin || length > region->length || address - begin > region->length - length) {
    return absl::OutOfRangeError(absl::StrCat(length, " bytes at 0x", absl::Hex(address),
                                              " are outside the region [0x", absl::Hex(begin),
                                              ", 0x", absl::Hex(begin + region->length), ")"));
  }
  ++region->pins;
  return region;
}

bool GrpcTransport::KnowsKey(absl::string_view key) {
  absl::MutexLock lock(&regions_mu_);
  if (!LooksLikeKey(key)) return false;
  auto it = regions_.find(KeyRegionId(key));
  return it != regions_.end() && !it->second->removed && SameKey(key, it->second->key);
}

void GrpcTransport::Unpin(Region* region) {
  absl::MutexLock lock(&regions_mu_);
  --region->pins;
}

absl::Status GrpcTransport::AcquireLocalRegions(TransferState& transfer) {
  absl::MutexLock lock(&regions_mu_);
  const std::vector<TransferSegment>& segments = transfer.request.segments;
  Region* last = nullptr;
  auto contains = [](const Region* r, const TransferSegment& s) {
    const auto begin = reinterpret_cast<uint64_t>(r->base);
    return s.local_address >= begin && s.length <= r->length &&
           s.local_address - begin <= r->length - s.length;
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    const TransferSegment& s = segments[i];
    // Segments mostly lie in the region of the one before (a KV pool's blocks).
    if (last == nullptr || !contains(last, s)) {
      // The region starting at or below the segment is the only one that can hold it.
      auto it = by_address_.upper_bound(s.local_address);
      last = it == by_address_.begin() ? nullptr : std::prev(it)->second;
      if (last == nullptr || !contains(last, s)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "segment ", i, " (", s.length, " bytes at local 0x", absl::Hex(s.local_address),
            ") is not inside a region registered with this transport"));
      }
      if (std::find(transfer.local_regions.begin(), transfer.local_regions.end(), last) ==
          transfer.local_regions.end()) {
        transfer.local_regions.push_back(last);
      }
    }
    transfer.bytes += s.length;
  }
  for (Region* region : transfer.local_regions) ++region->local_uses;
  return absl::OkStatus();
}

void GrpcTransport::ReleaseLocalRegions(const TransferState& transfer) {
  absl::MutexLock lock(&regions_mu_);
  for (Region* region : transfer.local_regions) --region->local_uses;
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

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> NewGrpcTransport(const TransportOptions& options) {
  if (options.grpc_chunk_bytes == 0 || options.grpc_chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("grpc_chunk_bytes is ", options.grpc_chunk_bytes,
                                                   "; use 1 to ", kMaxChunkBytes));
  }
  absl::StatusOr<int> port = ParsePort(options.listen_address);
  if (!port.ok()) return port.status();
  // gRPC shuts its library down when its last object goes, and that waits up to 10 s for an
  // internal poller: a process that destroys its only transport would stall. Held for the
  // process's lifetime instead.
  static const bool grpc_held = [] {
    grpc_init();
    return true;
  }();
  (void)grpc_held;
  auto transport = std::make_unique<GrpcTransport>(options);
  absl::Status started = transport->Start();
  if (!started.ok()) return started;
  return transport;
}

}  // namespace transfer
}  // namespace ferry
