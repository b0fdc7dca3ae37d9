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
// a miss), _read_bytes_total, _written_bytes_total, _rpc_seconds {method} (histogram),
// _evicted_objects_total, _expired_objects_total, _corrupt_reads_total,
// _fingerprint_mismatches_total.
//
// Auth: with an auth_token, every call without it ends UNAUTHENTICATED before it touches the store
// (the health service stays open).
//
// Thread-safe (gRPC calls handlers concurrently).

#ifndef FERRY_KVSTORE_SERVICE_KV_SERVICE_H_
#define FERRY_KVSTORE_SERVICE_KV_SERVICE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "ferry/v1/kvstore.grpc.pb.h"
#include "kvstore/kv_store.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ferry {
namespace kv {

struct KvServiceOptions {
  int64_t max_keys = 65536;            // per Exists / Get / Delete request
  int64_t max_chunk_bytes = 4 << 20;   // of data per Get chunk (a request may ask for less)
  int64_t put_batch_bytes = 16 << 20;  // objects handed to the store together
  int64_t capacity_bytes = 0;          // reported (the store's)
  // The shared token every call must carry (services/common/shared_token.h); empty: calls are
  // not checked. An unauthenticated Put into a store that serves requests is cache poisoning.
  std::string auth_token;
};

// The per-message limit a server around this service should set: a chunk of max_chunk_bytes
// plus its header.
inline int MaxMessageBytes(const KvServiceOptions& o) {
  return static_cast<int>(o.max_chunk_bytes + (64 << 10));
}

// Keeps glibc's allocator from handing the multi-MiB buffers of every call back to the kernel
// and faulting them in again on the next (mmap threshold 64 MiB, trim threshold 1 GiB): half of
// the service's CPU went to page faults without it. Call once at the start of a process that
// serves (or benchmarks) the store.
void TuneAllocatorForLargeBuffers();

class KvStoreService final : public ferry::v1::KvStore::Service {
 public:
  // `store` must outlive the service; `registry` may be null (no metrics).
  KvStoreService(KvStore* store, const KvServiceOptions& options = {},
                 std::shared_ptr<prometheus::Registry> registry = nullptr);
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
  void FillStats(const StoreStats& s, ferry::v1::StatsResponse* response) const;

  KvStore* const store_;
  const KvServiceOptions options_;
  std::unique_ptr<Metrics> metrics_;  // null without a registry
};

}  // namespace kv
}  // namespace ferry

#endif  // FERRY_KVSTORE_SERVICE_KV_SERVICE_H_
