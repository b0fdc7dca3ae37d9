// The gRPC face of the KV store (proto/ferry/v1/kvstore.proto) around a kv::KvStore, for
// `ferry-kvstore` (kvstore_main.cc).
//
// Bounds: a request names at most max_keys keys; Put objects are at most the store's
// max_object_bytes (larger ones are rejected, the rest of the call goes on); data travels in
// chunks of at most max_chunk_bytes, and the server refuses larger messages before they reach a
// handler (GrpcServerOptions). Deadlines: a call whose deadline passed stops at the next object
// with DEADLINE_EXCEEDED (objects already put stay durable). Put acknowledges only after the
// store's group fsync covering every object of the call.
//
// Metrics (on the registry given): ferry_kvstore_objects / _bytes {class}, _file_bytes,
// _capacity_bytes, _lookups_total {class, result} (the object's class on a hit, the request's on
// a miss), _read_bytes_total (value bytes sent in the stream or put through the transport),
// _written_bytes_total, _rpc_seconds {method} (histogram), _evicted_objects_total,
// _expired_objects_total, _corrupt_reads_total, _fingerprint_mismatches_total,
// _key_conflicts_total (objects put again with other bytes; the stored ones kept),
// _recovery_dropped_objects_total {reason = torn_tail|checksum|header} (records the store's
// start-up skipped: kv_store.h RecoveryDrop; every reason present from the start), and with a
// transport _transport_puts_total {outcome = ok|failed} and _staging_waits_total (values that
// found the staging area full and waited for room).
//
// Put answers `stored` (durable, already present ones included), `already_present` and the
// conflicting keys (KvStore::Put: the first writer's bytes are kept). Stats and Verify carry
// what the store's start-up skipped (recovery_dropped), and Verify its problem lines.
//
// Auth: with an auth_token, every call without it ends UNAUTHENTICATED before it touches the store
// (the health service stays open).
//
// Get into a transfer descriptor (GetRequest.destination): with a KV transport of its own
// (KvServiceOptions::transport), the node writes each found value straight into the caller's
// memory, one slice per requested key, and the stream carries headers only. The descriptor is
// checked first: it must parse (transfer_wire.h FromProto) and name one block slice per key, else
// INVALID_ARGUMENT. A node without a transport, or whose transport is of another kind than the
// descriptor's, or that cannot connect to the descriptor's address, answers FAILED_PRECONDITION
// (the request is fine, this node cannot serve it that way: ask it for the bytes in the stream).
// For each found object the node copies the value into its staging area (memory its transport
// registered, staging_bytes, allocated once; a call waits for room until its deadline; a value
// larger than the whole area is a miss), posts a put of it into the key's slice with the call's
// deadline (no transfer_id: the stream is the caller's completion), and once the put's callback
// ran writes that key's GetChunk: found with the full header (size, checksum, ...) and no data
// when the put succeeded; found=false when it failed (peer gone, deadline, a slice whose length
// is not the value's size; a slice outside its region fails the descriptor's check), never an
// error of the call. Puts
// overlap with the next keys' reads, so chunks may come in any index order. The staging slot is
// reused only after the put's callback ran. A put cut off by the call's deadline may still touch
// the caller's memory until the node's transport gives up on it (its cancel grace): callers
// reuse such memory only after that.
//
// Thread-safe (gRPC calls handlers concurrently).

#ifndef FERRY_KVSTORE_SERVICE_KV_SERVICE_H_
#define FERRY_KVSTORE_SERVICE_KV_SERVICE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "ferry/v1/kvstore.grpc.pb.h"
#include "kvstore/kv_store.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/common/shared_token.h"

namespace ferry {
namespace transfer {
class KvTransport;
}  // namespace transfer

namespace kv {

struct KvServiceOptions {
  int64_t max_keys = 65536;            // per Exists / Get / Delete request
  int64_t max_chunk_bytes = 4 << 20;   // of data per Get chunk (a request may ask for less)
  int64_t put_batch_bytes = 16 << 20;  // objects handed to the store together
  int64_t capacity_bytes = 0;          // reported (the store's)
  // The shared token every call must carry (services/common/shared_token.h); empty: calls are
  // not checked. An unauthenticated Put into a store that serves requests is cache poisoning.
  SharedToken auth_token;
  // The node's own KV transport, for Gets into a transfer descriptor; null: such a Get answers
  // FAILED_PRECONDITION. Not owned: it must outlive the service and every server that serves it.
  transfer::KvTransport* transport = nullptr;
  // With a transport: the registered memory values are staged in on their way out (allocated
  // once, by KvStoreService::Create). It bounds the bytes in flight through the transport.
  int64_t staging_bytes = int64_t{64} << 20;
  // Test seam: while this file exists, a Get into a destination waits after posting its first
  // value's put, before it answers anything (bounded by the call's deadline), so that tests can
  // act during a descriptor read. "": none.
  std::string get_hold_file;
};

// The per-message limit a server around this service should set: a chunk of max_chunk_bytes
// plus its header.
inline int MaxMessageBytes(const KvServiceOptions& o) {
  return static_cast<int>(o.max_chunk_bytes + (64 << 10));
}

class KvStoreService final : public ferry::v1::KvStore::Service {
 public:
  // The service, with or without a transport: with one, it allocates the staging area from it
  // (InvalidArgument for staging_bytes <= 0; the transport's error when Allocate fails).
  // `store` must outlive the service; `registry` may be null (no metrics).
  static absl::StatusOr<std::unique_ptr<KvStoreService>> Create(
      KvStore* store, const KvServiceOptions& options = {},
      std::shared_ptr<prometheus::Registry> registry = nullptr);

  // Without a transport only (options.transport must be null, a CHECK: Create allocates what a
  // transport needs).
  KvStoreService(KvStore* store, const KvServiceOptions& options = {},
                 std::shared_ptr<prometheus::Registry> registry = nullptr);
  // Gives the staging area back to the transport (left to the transport's own destructor while
  // a put still uses it).
  ~KvStoreService() override;

  grpc::Status Exists(grpc::ServerContext* context, const ferry::v1::ExistsRequest* request,
                      ferry::v1::ExistsResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const ferry::v1::GetRequest* request,
                   grpc::ServerWriter<ferry::v1::GetChunk>* writer) override;
  grpc::Status Put(grpc::ServerContext* context, grpc::ServerReader<ferry::v1::PutChunk>* reader,
                   ferry::v1::PutResponse* response) override;
  grpc::Status Delete(grpc::ServerContext* context, const ferry::v1::DeleteRequest* request,
                      ferry::v1::DeleteResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const ferry::v1::StatsRequest* request,
                     ferry::v1::StatsResponse* response) override;
  grpc::Status Verify(grpc::ServerContext* context, const ferry::v1::VerifyRequest* request,
                      ferry::v1::VerifyResponse* response) override;
  grpc::Status Compact(grpc::ServerContext* context, const ferry::v1::CompactRequest* request,
                       ferry::v1::StatsResponse* response) override;

  // Refreshes the gauges and the counters that mirror the store's (also done after every call).
  void RefreshMetrics();

 private:
  struct Metrics;
  struct Staging;

  KvStoreService(KvStore* store, const KvServiceOptions& options,
                 std::shared_ptr<prometheus::Registry> registry, std::unique_ptr<Staging> staging);
  void FillStats(const StoreStats& s, ferry::v1::StatsResponse* response) const;
  // Get with a destination: the values go through the transport (see the header comment).
  // Test seam: waits while options_.get_hold_file exists (bounded by the call's deadline).
  void HoldForTest(const grpc::ServerContext& context);
  grpc::Status GetIntoDestination(grpc::ServerContext* context,
                                  const ferry::v1::GetRequest& request,
                                  grpc::ServerWriter<ferry::v1::GetChunk>* writer);

  KvStore* const store_;
  const KvServiceOptions options_;
  std::unique_ptr<Staging> staging_;  // null without a transport
  std::unique_ptr<Metrics> metrics_;  // null without a registry
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_SERVICE_KV_SERVICE_H_
