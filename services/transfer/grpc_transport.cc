#include "services/transfer/grpc_transport.h"

#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/log.h"
#include "engine/common/status.h"
#include "ferry/v1/transfer.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "services/common/advertise_address.h"
#include "services/transfer/grpc_transport_internal.h"

namespace ferry {
namespace transfer {
namespace grpc_internal {
namespace {

// Threads that run the calls of posted transfers; more transfers wait in a queue.
constexpr int kWorkerThreads = 4;
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

// A remote key: magic, the region id (little endian) and random bytes that make it unguessable.
constexpr char kKeyMagic[] = {'F', 'g', 'k', '1'};
constexpr size_t kKeyIdOffset = sizeof(kKeyMagic);
constexpr size_t kKeyRandomBytes = 16;
constexpr size_t kKeyBytes = kKeyIdOffset + sizeof(uint64_t) + kKeyRandomBytes;

// Reads a bytes field's value of at most `max_bytes`.
bool ReadBytesField(CodedInputStream& in, uint32_t max_bytes, std::string* value) {
  uint32_t length = 0;
  return in.ReadVarint32(&length) && length <= max_bytes &&
         in.ReadString(value, static_cast<int>(length));
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

}  // namespace

// --- Wire (the format: grpc_transport_internal.h) ---

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

bool AtEnd(CodedInputStream& in) { return in.ReadTag() == 0 && in.ConsumedEntireMessage(); }

// --- Keys and addresses ---

bool LooksLikeKey(absl::string_view key) {
  return key.size() == kKeyBytes && key.substr(0, kKeyIdOffset) == absl::string_view(kKeyMagic, 4);
}

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

absl::Status GrpcTransport::Start() {
  if (!options_.advertise_host.empty()) {
    RETURN_IF_ERROR(
        ValidateAdvertiseHost("the KV transport's advertised host", options_.advertise_host));
  }
  RETURN_IF_ERROR(CheckAdvertisable("the KV transport's listen address", options_.listen_address,
                                    options_.advertise_host));
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
  // Listening everywhere, the transport has no host of its own to give peers: the options name
  // it (checked before the server started, below).
  address_ = AdvertisedAddress(absl::StrCat(HostOfAddress(options_.listen_address), ":", port),
                               options_.advertise_host);
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

}  // namespace grpc_internal

absl::StatusOr<std::unique_ptr<KvTransport>> NewGrpcTransport(const TransportOptions& options) {
  if (options.grpc_chunk_bytes == 0 || options.grpc_chunk_bytes > grpc_internal::kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("grpc_chunk_bytes is ", options.grpc_chunk_bytes,
                                                   "; use 1 to ", grpc_internal::kMaxChunkBytes));
  }
  absl::StatusOr<int> port = grpc_internal::ParsePort(options.listen_address);
  if (!port.ok()) return port.status();
  // gRPC shuts its library down when its last object goes, and that waits up to 10 s for an
  // internal poller: a process that destroys its only transport would stall. Held for the
  // process's lifetime instead.
  static const bool grpc_held = [] {
    grpc_init();
    return true;
  }();
  (void)grpc_held;
  auto transport = std::make_unique<grpc_internal::GrpcTransport>(options);
  absl::Status started = transport->Start();
  if (!started.ok()) return started;
  return transport;
}

}  // namespace transfer
}  // namespace ferry
