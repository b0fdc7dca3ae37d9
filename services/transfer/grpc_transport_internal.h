// The gRPC transport's insides (grpc_transport.h says what it does), declared for the files that
// define them:
// - grpc_transport.cc: the wire format of the data-carrying messages, the regions' keys, host:port
//   addresses, memory registration (and the pins that the server's copies and the client's
//   transfers hold on regions), the transport's start and shutdown, and the factory;
// - grpc_transport_server.cc: the server half, ferry.v1.KvTransfer over this transport's memory
//   (KvTransferService and its Write and Read reactors);
// - grpc_transport_client.cc: the client half, peers (channels) and transfers (the queue, the
//   worker threads' Write and Read calls, the owner's notification, completion).
//
// Internal to the grpc_transport library. Ownership: a GrpcTransport owns its regions, its server
// and service, its peers (shared with the transfers on them) and its threads; a reactor deletes
// itself when its call ends, and the transport's destructor waits for every reactor. Threading: as
// documented on GrpcTransport (three locks, never nested). Errors are absl::Status; the server
// answers with it converted to a gRPC status.

#ifndef FERRY_SERVICES_TRANSFER_GRPC_TRANSPORT_INTERNAL_H_
#define FERRY_SERVICES_TRANSFER_GRPC_TRANSPORT_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/transfer.grpc.pb.h"
#include "ferry/v1/transfer.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/server_callback.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/notification_board.h"
#include "services/transfer/transfer_metrics.h"

// Hidden visibility: nothing here is used outside the grpc_transport library (as when all of it
// was one file, with internal linkage).
#pragma GCC visibility push(hidden)

namespace ferry {
namespace transfer {
namespace grpc_internal {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;

constexpr absl::string_view kKind = "grpc";

// Metadata on a put's Write call: the bytes the stream will carry. It lets the target tell a
// stream that ended after its last byte from one that broke (a cancelled stream's last read
// fails just like a half-closed one's).
constexpr char kPutBytesMetadataKey[] = "x-ferry-kv-put-bytes";

// --- Wire ---
//
// The data-carrying messages (TransferWriteChunk, TransferReadChunk) are encoded and decoded by
// hand rather than by protobuf, so that the data is copied once on each side: from local memory
// into the outgoing gRPC buffer, and from the incoming gRPC buffer into memory. An encoded message
// is its other fields, serialized by protobuf, followed by the data field (the wire format allows
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
                                const char* data, size_t n);
grpc::ByteBuffer Encode(const google::protobuf::MessageLite& message);
bool Decode(grpc::ByteBuffer* buffer, google::protobuf::MessageLite* message);

// The fields of a TransferWriteChunk before its data; the stream is left at the data.
struct WriteChunkHead {
  bool has_key = false;
  std::string key;
  bool has_transfer_id = false;
  std::string transfer_id;
  uint64_t remote_address = 0;
  uint32_t data_bytes = 0;
};

// InvalidArgument for a malformed chunk (an unknown field, a key or transfer id too long); OK with
// data_bytes 0 for a chunk without data.
absl::Status ParseWriteChunkHead(CodedInputStream& in, WriteChunkHead* head);

// The fields of a TransferReadChunk before its data; the stream is left at the data.
struct ReadChunkHead {
  uint64_t range_index = 0;
  uint64_t offset = 0;
  uint32_t data_bytes = 0;
};

// DataLoss for a malformed chunk (an unknown field, or no data: the target always sends some).
absl::Status ParseReadChunkHead(CodedInputStream& in, ReadChunkHead* head);

// After the data: nothing may follow.
bool AtEnd(CodedInputStream& in);

// Whether `key` has the form of this transport's remote keys (not whether it names a region).
bool LooksLikeKey(absl::string_view key);

// Checks "host:port" ("[v6 address]:port" too) and returns the port.
absl::StatusOr<int> ParsePort(absl::string_view address);

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

class CallQueue;  // grpc_transport_client.cc

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
  const SharedToken& auth_token() const { return options_.auth_token; }
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

}  // namespace grpc_internal
}  // namespace transfer
}  // namespace ferry

#pragma GCC visibility pop

#endif  // FERRY_SERVICES_TRANSFER_GRPC_TRANSPORT_INTERNAL_H_
