#include "kvstore/service/kv_service.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/log.h"
#include "kvstore/wire.h"
#include "services/common/metrics.h"
#include "services/common/shared_token.h"

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

// Storage failures are the node's problem, not the request's: clients treat UNAVAILABLE as a
// node that is down (misses).
grpc::Status StoreError(const absl::Status& s) {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat("kv store: ", s.message()));
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

void TuneAllocatorForLargeBuffers() {
  ::mallopt(M_MMAP_THRESHOLD, 64 << 20);
  ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

struct KvStoreService::Metrics {
  std::array<prometheus::Gauge*, kNumTrafficClasses> objects{}, bytes{};
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
  std::mutex mu;
  StoreStats last;
};

KvStoreService::KvStoreService(KvStore* store, const KvServiceOptions& options,
                               std::shared_ptr<prometheus::Registry> registry)
    : store_(store), options_(options) {
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
  m.read_bytes = &prometheus::BuildCounter()
                      .Name("ferry_kvstore_read_bytes_total")
                      .Help("Value bytes served by Get.")
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
  RefreshMetrics();
}

KvStoreService::~KvStoreService() = default;

void KvStoreService::RefreshMetrics() {
  if (metrics_ == nullptr) return;
  Metrics& m = *metrics_;
  const StoreStats s = store_->Counters();
  std::lock_guard<std::mutex> lock(m.mu);
  for (int c = 0; c < kNumTrafficClasses; ++c) {
    m.objects[c]->Set(static_cast<double>(s.classes[c].objects));
    m.bytes[c]->Set(static_cast<double>(s.classes[c].bytes));
  }
  m.file_bytes->Set(static_cast<double>(s.file_bytes));
  auto grow = [](prometheus::Counter* c, int64_t now, int64_t before) {
    if (now > before) c->Increment(static_cast<double>(now - before));
  };
  grow(m.evicted, s.evicted, m.last.evicted);
  grow(m.expired, s.expired, m.last.expired);
  grow(m.corrupt, s.corrupt_reads, m.last.corrupt_reads);
  grow(m.mismatches, s.fingerprint_mismatches, m.last.fingerprint_mismatches);
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
  if (request->has_destination()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        "Get into a transfer descriptor needs the transfer layer; ask for bytes");
  }
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
    if (r.found) {
      ferry::v1::ObjectHeader* h = first.mutable_header();
      HashToProto(key, h->mutable_block_hash());
      HashToProto(r.meta.fingerprint, h->mutable_model_fingerprint());
      h->set_layout_tag(r.meta.layout_tag);
      h->set_token_count(r.meta.token_count);
      h->set_traffic_class(ClassToProto(r.meta.traffic_class));
      h->set_size_bytes(r.value.size());
      h->set_checksum(r.checksum);
      h->set_created_unix_ms(absl::ToUnixMillis(r.created));
    }
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
  uint32_t stored = 0;
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
    absl::Status s = store_->Put(items);
    if (!s.ok()) return s;
    stored += static_cast<uint32_t>(batch.size());
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
