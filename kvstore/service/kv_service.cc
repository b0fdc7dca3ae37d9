#include "kvstore/service/kv_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/log.h"
#include "kvstore/service/staging_area.h"
#include "kvstore/wire.h"
#include "services/common/metrics.h"
#include "services/common/shared_token.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_wire.h"

namespace ferry {
namespace kv {
namespace {

// Smaller chunks are not sent: a 4 MiB object in 1-byte messages is not a request to honour.
constexpr int64_t kMinChunkBytes = 4096;

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// The call's deadline passed or the client went away.
bool Done(grpc::ServerContext* context) {
  return context->IsCancelled() || context->deadline() < std::chrono::system_clock::now();
}

grpc::Status Ended(grpc::ServerContext* context) {
  return context->IsCancelled()
             ? grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled")
             : grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call's deadline passed");
}

// A Get into a transfer descriptor that this node cannot serve that way (the request itself is
// fine): the client asks again for the bytes in the stream.
grpc::Status CannotPut(const std::string& why) {
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      absl::StrCat(why, "; ask without a destination"));
}

// A call without a deadline still puts with one (the transport requires it): this long.
constexpr absl::Duration kMaxPutWait = absl::Seconds(60);
// How long past its puts' deadline a call waits for their callbacks (the transport promises them
// by the deadline plus its cancel grace).
constexpr absl::Duration kCallbackWait = absl::Seconds(10);

// The deadline of a call's puts and of its waits for staging room: the call's own, at most
// kMaxPutWait from now.
absl::Time PutDeadline(const grpc::ServerContext& context) {
  const auto now = std::chrono::system_clock::now();
  return absl::FromChrono(
      std::min(context.deadline(), now + std::chrono::seconds(absl::ToInt64Seconds(kMaxPutWait))));
}

void FillHeader(const Hash128& key, const GetResult& r, ferry::v1::ObjectHeader* h) {
  HashToProto(key, h->mutable_block_hash());
  HashToProto(r.meta.fingerprint, h->mutable_model_fingerprint());
  h->set_layout_tag(r.meta.layout_tag);
  h->set_token_count(r.meta.token_count);
  h->set_traffic_class(ClassToProto(r.meta.traffic_class));
  h->set_retention_floor_seconds(r.meta.retention_floor_s);
  h->set_size_bytes(r.value.size());
  h->set_checksum(r.checksum);
  h->set_created_unix_ms(absl::ToUnixMillis(r.created));
}

// The outcomes of one Get's puts, handed from the transport's callbacks to the call's handler.
// Shared by both (a callback may outlive a handler that gave up waiting). Thread-safe.
class PutOutcomes {
 public:
  struct Outcome {
    int index;
    absl::Status status;
  };

  // Before Post; Unposted when Post refused the put (its callback never runs).
  void Posted() {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  void Unposted() {
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
  // From the put's callback.
  void Done(int index, absl::Status status) {
    absl::MutexLock lock(&mu_);
    done_.push_back({index, std::move(status)});
    --in_flight_;
  }

  // The outcomes that arrived, waiting for one until `until` while puts are in flight.
  std::vector<Outcome> Take(absl::Time until) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !done_.empty() || in_flight_ == 0;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), until);
    std::vector<Outcome> taken;
    taken.swap(done_);
    return taken;
  }

  int in_flight() const {
    absl::MutexLock lock(&mu_);
    return in_flight_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Outcome> done_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

// Storage failures are the node's problem, not the request's: clients treat UNAVAILABLE as a
// node that is down (misses).
grpc::Status StoreError(const absl::Status& s) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("kv store: ", s.message()));
}

void SetRecoveryDrops(const std::array<int64_t, kNumRecoveryDrops>& dropped,
                      ferry::v1::RecoveryDrops* out) {
  out->set_torn_tail(static_cast<uint64_t>(dropped[static_cast<int>(RecoveryDrop::kTornTail)]));
  out->set_checksum(static_cast<uint64_t>(dropped[static_cast<int>(RecoveryDrop::kChecksum)]));
  out->set_header(static_cast<uint64_t>(dropped[static_cast<int>(RecoveryDrop::kHeader)]));
}

class Timer {
 public:
  explicit Timer(prometheus::Histogram* h) : h_(h), start_(std::chrono::steady_clock::now()) {}
  ~Timer() {
    if (h_ != nullptr) {
      h_->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
    }
  }

 private:
  prometheus::Histogram* h_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

struct KvStoreService::Staging {
  transfer::KvTransport* transport = nullptr;
  transfer::RegionId region = 0;
  // Shared with the puts' callbacks, which give their slots back.
  std::shared_ptr<StagingArea> area;
};

struct KvStoreService::Metrics {
  std::array<prometheus::Gauge*, kNumTrafficClasses> objects{}, bytes{};
  std::array<prometheus::Gauge*, kFloorBuckets> objects_by_floor{};
  prometheus::Gauge* file_bytes = nullptr;
  prometheus::Gauge* capacity_bytes = nullptr;
  std::array<prometheus::Counter*, kNumTrafficClasses> hits{}, misses{};
  prometheus::Counter* read_bytes = nullptr;
  prometheus::Counter* written_bytes = nullptr;
  prometheus::Histogram* exists_seconds = nullptr;
  prometheus::Histogram* get_seconds = nullptr;
  prometheus::Histogram* put_seconds = nullptr;
  prometheus::Histogram* delete_seconds = nullptr;
  // Mirrors of the store's cumulative counters: incremented by their growth.
  prometheus::Counter* evicted = nullptr;
  prometheus::Counter* expired = nullptr;
  prometheus::Counter* corrupt = nullptr;
  prometheus::Counter* mismatches = nullptr;
  prometheus::Counter* key_conflicts = nullptr;
  std::array<prometheus::Counter*, kNumRecoveryDrops> recovery_dropped{};
  // With a transport.
  prometheus::Counter* puts_ok = nullptr;
  prometheus::Counter* puts_failed = nullptr;
  prometheus::Counter* staging_waits = nullptr;
  absl::Mutex mu;
  StoreStats last ABSL_GUARDED_BY(mu);
};

absl::StatusOr<std::unique_ptr<KvStoreService>> KvStoreService::Create(
    KvStore* store, const KvServiceOptions& options,
    std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<Staging> staging;
  if (options.transport != nullptr) {
    if (options.staging_bytes <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv service: staging_bytes ", options.staging_bytes, " must be positive"));
    }
    absl::StatusOr<transfer::LocalRegion> region =
        options.transport->Allocate(static_cast<size_t>(options.staging_bytes));
    if (!region.ok()) {
      return absl::Status(region.status().code(),
                          absl::StrCat("kv service: staging area of ", options.staging_bytes,
                                       " bytes: ", region.status().message()));
    }
    staging = std::make_unique<Staging>();
    staging->transport = options.transport;
    staging->region = region->id;
    staging->area = std::make_shared<StagingArea>(
        absl::Span<char>(static_cast<char*>(region->span.address), region->span.length));
  }
  return std::unique_ptr<KvStoreService>(
      new KvStoreService(store, options, std::move(registry), std::move(staging)));
}

KvStoreService::KvStoreService(KvStore* store, const KvServiceOptions& options,
                               std::shared_ptr<prometheus::Registry> registry)
    : KvStoreService(store, options, std::move(registry), nullptr) {
  CHECK(options.transport == nullptr) << "a KvStoreService with a transport comes from Create()";
}

KvStoreService::KvStoreService(KvStore* store, const KvServiceOptions& options,
                               std::shared_ptr<prometheus::Registry> registry,
                               std::unique_ptr<Staging> staging)
    : store_(store), options_(options), staging_(std::move(staging)) {
  if (registry == nullptr) return;
  metrics_ = std::make_unique<Metrics>();
  Metrics& m = *metrics_;
  auto& objects = prometheus::BuildGauge()
                      .Name("ferry_kvstore_objects")
                      .Help("Objects stored, by traffic class.")
                      .Register(*registry);
  auto& bytes = prometheus::BuildGauge()
                    .Name("ferry_kvstore_bytes")
                    .Help("Value bytes stored, by traffic class.")
                    .Register(*registry);
  auto& lookups = prometheus::BuildCounter()
                      .Name("ferry_kvstore_lookups_total")
                      .Help(
                          "Objects asked for by Get: hits (the object's class) and misses (the "
                          "request's class).")
                      .Register(*registry);
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    const std::string name = TrafficClassName(static_cast<TrafficClass>(c));
    m.objects[c] = &objects.Add({{"class", name}});
    m.bytes[c] = &bytes.Add({{"class", name}});
    m.hits[c] = &lookups.Add({{"class", name}, {"result", "hit"}});
    m.misses[c] = &lookups.Add({{"class", name}, {"result", "miss"}});
  }
  auto& by_floor = prometheus::BuildGauge()
                       .Name("ferry_kvstore_objects_by_retention_floor")
                       .Help(
                           "Objects stored, by their retention floor (a request's cache_control "
                           "ttl): none, up to 5m, up to 1h, longer.")
                       .Register(*registry);
  for (int b = 0; b < kFloorBuckets; ++b) {
    m.objects_by_floor[b] = &by_floor.Add({{"floor", FloorBucketName(b)}});
  }
  m.file_bytes = &prometheus::BuildGauge()
                      .Name("ferry_kvstore_file_bytes")
                      .Help("Bytes of the segment files on disk.")
                      .Register(*registry)
                      .Add({});
  m.capacity_bytes = &prometheus::BuildGauge()
                          .Name("ferry_kvstore_capacity_bytes")
                          .Help("The store's capacity limit.")
                          .Register(*registry)
                          .Add({});
  m.capacity_bytes->Set(static_cast<double>(options_.capacity_bytes));
  m.read_bytes =
      &prometheus::BuildCounter()
           .Name("ferry_kvstore_read_bytes_total")
           .Help("Value bytes served by Get, in the stream or put through the KV transport.")
           .Register(*registry)
           .Add({});
  m.written_bytes = &prometheus::BuildCounter()
                         .Name("ferry_kvstore_written_bytes_total")
                         .Help("Value bytes received by Put and stored.")
                         .Register(*registry)
                         .Add({});
  auto& rpc = prometheus::BuildHistogram()
                  .Name("ferry_kvstore_rpc_seconds")
                  .Help("Latency of the KV store's calls, by method.")
                  .Register(*registry);
  m.exists_seconds = &rpc.Add({{"method", "Exists"}}, LatencyBucketsSeconds());
  m.get_seconds = &rpc.Add({{"method", "Get"}}, LatencyBucketsSeconds());
  m.put_seconds = &rpc.Add({{"method", "Put"}}, LatencyBucketsSeconds());
  m.delete_seconds = &rpc.Add({{"method", "Delete"}}, LatencyBucketsSeconds());
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry).Add({});
  };
  m.evicted =
      counter("ferry_kvstore_evicted_objects_total", "Objects evicted to stay within capacity.");
  m.expired = counter("ferry_kvstore_expired_objects_total", "Objects dropped by their TTL.");
  m.corrupt = counter("ferry_kvstore_corrupt_reads_total",
                      "Objects that failed their checksum or header check (served as misses).");
  m.mismatches = counter("ferry_kvstore_fingerprint_mismatches_total",
                         "Objects asked for with another model fingerprint (misses).");
  m.key_conflicts = counter(
      "ferry_kvstore_key_conflicts_total",
      "Objects put again with other bytes than the stored ones (a hash collision or a writer's "
      "bug); the stored bytes were kept.");
  auto& dropped = prometheus::BuildCounter()
                      .Name("ferry_kvstore_recovery_dropped_objects_total")
                      .Help(
                          "Records skipped while opening the store, by reason: torn_tail (the "
                          "segment being written at a crash, never acknowledged), checksum and "
                          "header (corruption).")
                      .Register(*registry);
  for (int r = 0; r < kNumRecoveryDrops; ++r) {
    m.recovery_dropped[r] =
        &dropped.Add({{"reason", RecoveryDropName(static_cast<RecoveryDrop>(r))}});
  }
  if (staging_ != nullptr) {
    auto& puts = prometheus::BuildCounter()
                     .Name("ferry_kvstore_transport_puts_total")
                     .Help(
                         "Values a Get put into the caller's memory through the node's KV "
                         "transport, by outcome (a failed one is a miss).")
                     .Register(*registry);
    m.puts_ok = &puts.Add({{"outcome", "ok"}});
    m.puts_failed = &puts.Add({{"outcome", "failed"}});
    m.staging_waits =
        counter("ferry_kvstore_staging_waits_total",
                "Values that found the transport's staging area full and waited for room.");
  }
  RefreshMetrics();
}

KvStoreService::~KvStoreService() {
  if (staging_ == nullptr) return;
  // A put still running (its call gave up waiting for it) keeps the region registered; the
  // transport frees it when it ends.
  if (absl::Status s = staging_->transport->Deregister(staging_->region); !s.ok()) {
    LOG(WARNING) << "kv service: staging area left to the transport: " << s;
  }
}

void KvStoreService::RefreshMetrics() {
  if (metrics_ == nullptr) return;
  Metrics& m = *metrics_;
  const StoreStats s = store_->Counters();
  absl::MutexLock lock(&m.mu);
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    m.objects[c]->Set(static_cast<double>(s.classes[c].objects));
    m.bytes[c]->Set(static_cast<double>(s.classes[c].bytes));
  }
  for (int b = 0; b < kFloorBuckets; ++b) {
    m.objects_by_floor[b]->Set(static_cast<double>(s.objects_by_floor[b]));
  }
  m.file_bytes->Set(static_cast<double>(s.file_bytes));
  auto grow = [](prometheus::Counter* c, int64_t now, int64_t before) {
    if (now > before) c->Increment(static_cast<double>(now - before));
  };
  grow(m.evicted, s.evicted, m.last.evicted);
  grow(m.expired, s.expired, m.last.expired);
  grow(m.corrupt, s.corrupt_reads, m.last.corrupt_reads);
  grow(m.mismatches, s.fingerprint_mismatches, m.last.fingerprint_mismatches);
  grow(m.key_conflicts, s.key_conflicts, m.last.key_conflicts);
  for (int r = 0; r < kNumRecoveryDrops; ++r) {
    grow(m.recovery_dropped[r], s.recovery_dropped[r], m.last.recovery_dropped[r]);
  }
  m.last = s;
}

grpc::Status KvStoreService::Exists(grpc::ServerContext* context,
                                    const ferry::v1::ExistsRequest* request,
                                    ferry::v1::ExistsResponse* response) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) return s;
  Timer timer(metrics_ ? metrics_->exists_seconds : nullptr);
  if (request->block_hashes_size() > options_.max_keys) {
    return Invalid(absl::StrCat("Exists names ", request->block_hashes_size(), " blocks; at most ",
                                options_.max_keys));
  }
  if (Done(context)) return Ended(context);
  std::vector<Hash128> keys;
  keys.reserve(request->block_hashes_size());
  for (const auto& h : request->block_hashes()) keys.push_back(HashFromProto(h));
  const ExistsResult r = store_->Exists(keys, HashFromProto(request->model_fingerprint()));
  response->set_longest_present_prefix(static_cast<uint32_t>(r.prefix));
  for (bool p : r.present) response->add_present_flags(p);
  for (uint32_t floor : r.retention_floor_s) response->add_retention_floor_seconds(floor);
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Get(grpc::ServerContext* context, const ferry::v1::GetRequest* request,
                                 grpc::ServerWriter<ferry::v1::GetChunk>* writer) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) return s;
  Timer timer(metrics_ ? metrics_->get_seconds : nullptr);
  if (request->block_hashes_size() > options_.max_keys) {
    return Invalid(absl::StrCat("Get names ", request->block_hashes_size(), " blocks; at most ",
                                options_.max_keys));
  }
  if (request->has_destination()) return GetIntoDestination(context, *request, writer);
  const int64_t chunk = std::clamp<int64_t>(
      request->max_chunk_bytes() == 0 ? options_.max_chunk_bytes : request->max_chunk_bytes(),
      kMinChunkBytes, std::max(kMinChunkBytes, options_.max_chunk_bytes));
  const Hash128 fingerprint = HashFromProto(request->model_fingerprint());
  const int miss_class = static_cast<int>(ClassFromProto(request->context().traffic_class()));
  for (int i = 0; i < request->block_hashes_size(); ++i) {
    if (Done(context)) return Ended(context);
    const Hash128 key = HashFromProto(request->block_hashes(i));
    GetResult r = std::move(store_->Get({key}, fingerprint)[0]);
    ferry::v1::GetChunk first;
    first.set_index(static_cast<uint32_t>(i));
    first.set_found(r.found);
    if (metrics_ != nullptr) {
      (r.found ? metrics_->hits[static_cast<int>(r.meta.traffic_class)]
               : metrics_->misses[miss_class])
          ->Increment();
      if (r.found) metrics_->read_bytes->Increment(static_cast<double>(r.value.size()));
    }
    if (r.found) FillHeader(key, r, first.mutable_header());
    // The first chunk carries the header and the first piece of data.
    const int64_t size = static_cast<int64_t>(r.value.size());
    int64_t offset = std::min<int64_t>(chunk, size);
    if (offset == size) {
      first.set_data(std::move(r.value));  // the whole object: no copy
    } else {
      first.set_data(r.value.data(), static_cast<size_t>(offset));
    }
    if (!writer->Write(first)) return Ended(context);
    while (offset < size) {
      ferry::v1::GetChunk more;
      more.set_index(static_cast<uint32_t>(i));
      more.set_offset(static_cast<uint64_t>(offset));
      const int64_t n = std::min<int64_t>(chunk, size - offset);
      more.set_data(r.value.data() + offset, static_cast<size_t>(n));
      if (!writer->Write(more)) return Ended(context);
      offset += n;
    }
  }
  RefreshMetrics();
  return grpc::Status::OK;
}

void KvStoreService::HoldForTest(const grpc::ServerContext& context) {
  const std::string& hold = options_.get_hold_file;
  if (access(hold.c_str(), F_OK) != 0) return;
  LOG(INFO) << "test seam: a Get into a destination holds after its first put while " << hold
            << " exists";
  const auto until =
      std::min(context.deadline(), std::chrono::system_clock::now() + std::chrono::seconds(60));
  while (access(hold.c_str(), F_OK) == 0 && std::chrono::system_clock::now() < until &&
         !context.IsCancelled()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

grpc::Status KvStoreService::GetIntoDestination(grpc::ServerContext* context,
                                                const ferry::v1::GetRequest& request,
                                                grpc::ServerWriter<ferry::v1::GetChunk>* writer) {
  if (staging_ == nullptr) {
    return CannotPut("this node moves bytes in the Get stream only");
  }
  transfer::KvTransport* const transport = staging_->transport;
  absl::StatusOr<transfer::PeerDescriptor> destination = transfer::FromProto(request.destination());
  if (!destination.ok()) {
    return Invalid(absl::StrCat("Get destination: ", destination.status().message()));
  }
  if (destination->kind != transport->kind()) {
    return CannotPut(absl::StrCat("the destination is memory of a ", destination->kind,
                                  " transport; this node's transport is ", transport->kind()));
  }
  if (destination->block_slices.size() != static_cast<size_t>(request.block_hashes_size())) {
    return Invalid(absl::StrCat("Get destination has ", destination->block_slices.size(),
                                " block slices for ", request.block_hashes_size(),
                                " blocks; one per block"));
  }
  const absl::Time deadline = PutDeadline(*context);
  const absl::StatusOr<transfer::PeerId> peer = transport->Connect(destination->address);
  if (!peer.ok()) {
    return CannotPut(
        absl::StrCat("cannot connect to the destination's transport: ", peer.status().message()));
  }
  const Hash128 fingerprint = HashFromProto(request.model_fingerprint());
  const int miss_class = static_cast<int>(ClassFromProto(request.context().traffic_class()));
  const std::shared_ptr<StagingArea> area = staging_->area;
  auto outcomes = std::make_shared<PutOutcomes>();
  // The found chunk of each put in flight, written once its callback ran.
  std::map<int, ferry::v1::GetChunk> awaiting;
  std::vector<transfer::TransferId> posted;
  int64_t failed = 0;
  absl::Status first_failure;
  bool writable = true;  // false once the stream broke (the client went away)

  auto write = [&](const ferry::v1::GetChunk& chunk) {
    writable = writable && writer->Write(chunk);
  };
  auto miss = [&](int index) {
    ferry::v1::GetChunk chunk;
    chunk.set_index(static_cast<uint32_t>(index));
    chunk.set_found(false);
    write(chunk);
  };
  auto put_failed = [&](int index, const absl::Status& why) {
    if (metrics_ != nullptr) metrics_->puts_failed->Increment();
    if (failed++ == 0) first_failure = why;
    miss(index);
  };
  auto settle = [&](const PutOutcomes::Outcome& outcome) {
    auto it = awaiting.find(outcome.index);
    if (!outcome.status.ok()) {
      awaiting.erase(it);
      put_failed(outcome.index, outcome.status);
      return;
    }
    if (metrics_ != nullptr) {
      metrics_->puts_ok->Increment();
      metrics_->read_bytes->Increment(static_cast<double>(it->second.header().size_bytes()));
    }
    write(it->second);
    awaiting.erase(it);
  };

  grpc::Status status = grpc::Status::OK;
  for (int i = 0; i < request.block_hashes_size() && writable; ++i) {
    if (i == 1 && !options_.get_hold_file.empty()) HoldForTest(*context);
    for (const PutOutcomes::Outcome& o : outcomes->Take(absl::InfinitePast())) settle(o);
    if (Done(context)) {
      status = Ended(context);
      break;
    }
    const Hash128 key = HashFromProto(request.block_hashes(i));
    const GetResult r = std::move(store_->Get({key}, fingerprint)[0]);
    if (metrics_ != nullptr) {
      (r.found ? metrics_->hits[static_cast<int>(r.meta.traffic_class)]
               : metrics_->misses[miss_class])
          ->Increment();
    }
    if (!r.found) {
      miss(i);
      continue;
    }
    // The value, staged in registered memory, then put into the key's slice.
    const size_t size = r.value.size();
    if (destination->block_slices[i].length != size) {
      put_failed(i, absl::InvalidArgumentError(absl::StrCat("block slice ", i, " is ",
                                                            destination->block_slices[i].length,
                                                            " bytes for a value of ", size)));
      continue;
    }
    bool waited = false;
    absl::StatusOr<absl::Span<char>> slot = area->Acquire(size, deadline, &waited);
    if (waited && metrics_ != nullptr) metrics_->staging_waits->Increment();
    if (!slot.ok()) {
      put_failed(i, slot.status());
      continue;
    }
    std::memcpy(slot->data(), r.value.data(), size);
    const MemorySpan local{slot->data(), size};
    absl::StatusOr<transfer::TransferRequest> put =
        transfer::BlockTransferRequest(*destination, static_cast<size_t>(i),
                                       absl::MakeConstSpan(&local, 1), transfer::TransferOp::kPut);
    if (!put.ok()) {
      area->Release(*slot);
      put_failed(i, put.status());
      continue;
    }
    put->peer = *peer;
    put->deadline = deadline;
    put->transfer_id.clear();  // the stream tells the caller
    ferry::v1::GetChunk& found = awaiting[i];
    found.set_index(static_cast<uint32_t>(i));
    found.set_found(true);
    FillHeader(key, r, found.mutable_header());
    outcomes->Posted();
    absl::StatusOr<transfer::TransferId> id =
        transport->Post(std::move(*put), [outcomes, area, slot = *slot, i](absl::Status s) {
          area->Release(slot);  // the transport is done with it
          outcomes->Done(i, std::move(s));
        });
    if (!id.ok()) {
      outcomes->Unposted();
      area->Release(*slot);
      awaiting.erase(i);
      put_failed(i, id.status());
      continue;
    }
    posted.push_back(*id);
  }
  // Nobody reads the rest: stop the puts still running.
  if (!writable || !status.ok()) {
    for (transfer::TransferId id : posted) transport->Cancel(id);
  }
  // Every put's callback (they come by the deadline plus the transport's cancel grace).
  const absl::Time give_up = deadline + kCallbackWait;
  while (outcomes->in_flight() > 0 && absl::Now() < give_up) {
    for (const PutOutcomes::Outcome& o : outcomes->Take(give_up)) settle(o);
  }
  for (const PutOutcomes::Outcome& o : outcomes->Take(absl::InfinitePast())) settle(o);
  if (const int left = outcomes->in_flight(); left > 0) {
    LOG(ERROR) << "kv service: " << left << " put(s) of a Get still running " << kCallbackWait
               << " past their deadline; their staging slots come back when they end";
  }
  if (failed > 0) {
    LOG(WARNING) << "kv service: " << failed << " of " << request.block_hashes_size()
                 << " values of a Get could not be put into the destination (misses); the "
                    "first: "
                 << first_failure;
  }
  if (status.ok() && !writable) status = Ended(context);
  RefreshMetrics();
  return status;
}

grpc::Status KvStoreService::Put(grpc::ServerContext* context,
                                 grpc::ServerReader<ferry::v1::PutChunk>* reader,
                                 ferry::v1::PutResponse* response) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) return s;
  Timer timer(metrics_ ? metrics_->put_seconds : nullptr);
  struct Object {
    PutItem item;
    std::string value;
    uint64_t size = 0;
    uint64_t checksum = 0;
  };
  std::vector<Object> batch;
  int64_t batch_bytes = 0;
  Object current;
  bool open = false;      // an object is being received
  bool skipping = false;  // its chunks are dropped (rejected)
  uint32_t stored = 0, already_present = 0;
  auto reject = [&](const Hash128& key, const std::string& reason) {
    ferry::v1::PutRejection* r = response->add_rejections();
    HashToProto(key, r->mutable_block_hash());
    r->set_reason(reason);
  };
  auto flush = [&]() -> absl::Status {
    if (batch.empty()) return absl::OkStatus();
    std::vector<PutItem> items;
    for (Object& o : batch) {
      o.item.value = o.value;
      items.push_back(o.item);
    }
    PutResult result;
    absl::Status s = store_->Put(items, &result);
    if (!s.ok()) return s;
    stored += static_cast<uint32_t>(batch.size());
    already_present += static_cast<uint32_t>(result.already_present);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (result.outcomes[i] == PutOutcome::kConflict) {
        HashToProto(batch[i].item.key, response->add_conflicting_block_hashes());
      }
    }
    if (metrics_ != nullptr) metrics_->written_bytes->Increment(static_cast<double>(batch_bytes));
    batch.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  // An object whose bytes are all here joins the batch (checked against its checksum).
  auto finish = [&]() -> absl::Status {
    open = false;
    if (skipping) return absl::OkStatus();
    if (current.value.size() != current.size) {
      reject(current.item.key, absl::StrCat("incomplete: ", current.value.size(), " of ",
                                            current.size, " bytes arrived"));
      return absl::OkStatus();
    }
    if (current.checksum != 0 && Checksum(current.value) != current.checksum) {
      reject(current.item.key, "checksum mismatch: the bytes are not the ones described");
      return absl::OkStatus();
    }
    batch_bytes += static_cast<int64_t>(current.value.size());
    batch.push_back(std::move(current));
    if (batch_bytes >= options_.put_batch_bytes) return flush();
    return absl::OkStatus();
  };

  ferry::v1::PutChunk chunk;
  while (reader->Read(&chunk)) {
    if (Done(context)) return Ended(context);
    if (chunk.has_header()) {
      if (open) {
        absl::Status s = finish();
        if (!s.ok()) return StoreError(s);
      }
      const ferry::v1::ObjectHeader& h = chunk.header();
      current = Object();
      current.item.key = HashFromProto(h.block_hash());
      current.item.meta.fingerprint = HashFromProto(h.model_fingerprint());
      current.item.meta.layout_tag = h.layout_tag();
      current.item.meta.token_count = h.token_count();
      current.item.meta.traffic_class = ClassFromProto(h.traffic_class());
      current.item.meta.retention_floor_s = h.retention_floor_seconds();
      current.size = h.size_bytes();
      current.checksum = h.checksum();
      open = true;
      skipping = false;
      if (!h.has_block_hash() || !h.has_model_fingerprint()) {
        reject(current.item.key, "the header needs a block hash and a model fingerprint");
        skipping = true;
      } else if (h.size_bytes() > static_cast<uint64_t>(store_->max_object_bytes())) {
        reject(current.item.key, absl::StrCat("object of ", h.size_bytes(),
                                              " bytes is larger than the store's limit (",
                                              store_->max_object_bytes(), ")"));
        skipping = true;
      }
    } else if (!open) {
      return Invalid("a Put chunk without a header before it");
    }
    if (skipping || chunk.data().empty()) continue;
    if (chunk.offset() != current.value.size() ||
        current.value.size() + chunk.data().size() > current.size) {
      reject(current.item.key,
             absl::StrCat("chunk at offset ", chunk.offset(), " of ", chunk.data().size(),
                          " bytes does not continue the ", current.value.size(), " of ",
                          current.size, " bytes received"));
      skipping = true;
      continue;
    }
    if (current.value.empty() && chunk.data().size() == current.size) {
      current.value = std::move(*chunk.mutable_data());  // the whole object: no copy
    } else {
      if (current.value.empty()) current.value.reserve(current.size);
      current.value.append(chunk.data());
    }
  }
  if (open) {
    absl::Status s = finish();
    if (!s.ok()) return StoreError(s);
  }
  if (Done(context)) return Ended(context);
  if (absl::Status s = flush(); !s.ok()) return StoreError(s);
  response->set_stored(stored);
  response->set_already_present(already_present);
  RefreshMetrics();
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Delete(grpc::ServerContext* context,
                                    const ferry::v1::DeleteRequest* request,
                                    ferry::v1::DeleteResponse* response) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) return s;
  Timer timer(metrics_ ? metrics_->delete_seconds : nullptr);
  if (request->block_hashes_size() > options_.max_keys) {
    return Invalid(absl::StrCat("Delete names ", request->block_hashes_size(), " blocks; at most ",
                                options_.max_keys));
  }
  if (Done(context)) return Ended(context);
  std::vector<Hash128> keys;
  for (const auto& h : request->block_hashes()) keys.push_back(HashFromProto(h));
  auto deleted = store_->Delete(keys);
  if (!deleted.ok()) return StoreError(deleted.status());
  response->set_deleted(static_cast<uint32_t>(*deleted));
  RefreshMetrics();
  return grpc::Status::OK;
}

void KvStoreService::FillStats(const StoreStats& s, ferry::v1::StatsResponse* r) const {
  r->set_objects(static_cast<uint64_t>(s.objects));
  r->set_bytes(static_cast<uint64_t>(s.value_bytes));
  r->set_capacity_bytes(static_cast<uint64_t>(options_.capacity_bytes));
  r->set_segments(static_cast<uint32_t>(s.segments));
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    ferry::v1::ClassStats* cs = r->add_classes();
    cs->set_traffic_class(ClassToProto(static_cast<TrafficClass>(c)));
    cs->set_objects(static_cast<uint64_t>(s.classes[c].objects));
    cs->set_bytes(static_cast<uint64_t>(s.classes[c].bytes));
    cs->set_retention_seconds(
        static_cast<uint32_t>(absl::ToInt64Seconds(store_->ttl(static_cast<TrafficClass>(c)))));
    for (int64_t n : s.classes[c].by_age) cs->add_age_bucket_counts(static_cast<uint64_t>(n));
  }
  r->set_hits(static_cast<uint64_t>(s.hits));
  r->set_misses(static_cast<uint64_t>(s.misses));
  r->set_corrupt_reads(static_cast<uint64_t>(s.corrupt_reads));
  r->set_evicted_objects(static_cast<uint64_t>(s.evicted));
  r->set_file_bytes(static_cast<uint64_t>(s.file_bytes));
  r->set_expired_objects(static_cast<uint64_t>(s.expired));
  r->set_fingerprint_mismatches(static_cast<uint64_t>(s.fingerprint_mismatches));
  r->set_puts(static_cast<uint64_t>(s.puts));
  r->set_put_bytes(static_cast<uint64_t>(s.put_bytes));
  r->set_deletes(static_cast<uint64_t>(s.deletes));
  r->set_read_bytes(static_cast<uint64_t>(s.read_bytes));
  r->set_group_commits(static_cast<uint64_t>(s.group_commits));
  r->set_compactions(static_cast<uint64_t>(s.compactions));
  r->set_rewritten_objects(static_cast<uint64_t>(s.rewritten));
  r->set_direct_io(s.direct_io);
  r->set_open_seconds(s.open_seconds);
  r->set_open_objects(static_cast<uint64_t>(s.open_objects));
  r->set_segments_from_footer(static_cast<uint32_t>(s.segments_from_footer));
  r->set_segments_scanned(static_cast<uint32_t>(s.segments_scanned));
  r->set_torn_bytes_dropped(static_cast<uint64_t>(s.torn_bytes_dropped));
  SetRecoveryDrops(s.recovery_dropped, r->mutable_recovery_dropped());
  r->set_already_present(static_cast<uint64_t>(s.already_present));
  r->set_key_conflicts(static_cast<uint64_t>(s.key_conflicts));
}

grpc::Status KvStoreService::Stats(grpc::ServerContext* context, const ferry::v1::StatsRequest*,
                                   ferry::v1::StatsResponse* response) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) return s;
  FillStats(store_->Stats(), response);
  RefreshMetrics();
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Verify(grpc::ServerContext* context, const ferry::v1::VerifyRequest*,
                                    ferry::v1::VerifyResponse* response) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) return s;
  const VerifyReport report = store_->Verify();
  response->set_objects_checked(static_cast<uint64_t>(report.objects_checked));
  response->set_bytes_checked(static_cast<uint64_t>(report.bytes_checked));
  response->set_corrupt(static_cast<uint64_t>(report.corrupt));
  for (const std::string& p : report.problems) response->add_problems(p);
  SetRecoveryDrops(report.recovery_dropped, response->mutable_recovery_dropped());
  RefreshMetrics();
  return grpc::Status::OK;
}

grpc::Status KvStoreService::Compact(grpc::ServerContext* context, const ferry::v1::CompactRequest*,
                                     ferry::v1::StatsResponse* response) {
  if (grpc::Status s = CheckSharedToken(*context, options_.auth_token); !s.ok()) return s;
  if (absl::Status s = store_->Compact(); !s.ok()) return StoreError(s);
  FillStats(store_->Stats(), response);
  RefreshMetrics();
  return grpc::Status::OK;
}

}  // namespace kv
}  // namespace ferry
