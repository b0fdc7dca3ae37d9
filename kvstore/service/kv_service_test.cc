// The KV store service on loopback: every library behaviour through the wire (put in chunks,
// get in chunks, exists, delete, stats, verify, compact), rejections with reasons, oversized
// messages refused with a clear status, deadlines honoured, and the metrics; puts of objects
// already present (conflicts among them), and what the store skipped at start-up in Stats,
// Verify and the metrics (their text exposition too). Gets into a transfer
// descriptor, for the gRPC transport and UCX over tcp (a "worker" transport in this process owns
// the destination memory, the node has its own): values bit-exact in that memory with no data in
// the stream, misses for absent keys, wrong slice lengths and values larger than the staging
// area, invalid descriptors refused, a node without a transport refusing with
// FAILED_PRECONDITION while the client's GetInto falls back to bytes.

#include "kvstore/service/kv_service.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>

#include "ferry/v1/kvstore.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "kvstore/client/kv_client.h"
#include "prometheus/text_serializer.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_server.h"
#include "services/common/shared_token.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_wire.h"

namespace ferry {
namespace kv {
namespace {

namespace fs = std::filesystem;
using ferry::v1::GetChunk;
using ferry::v1::PutChunk;

const Hash128 kModel = Xxh3Hash128("model");

Hash128 Key(int i) { return Xxh3Hash128("block " + std::to_string(i)); }
// The retention floor the tests' puts give object i.
uint32_t FloorOf(int i) { return 100 * static_cast<uint32_t>(i); }

void Set(const Hash128& h, ferry::v1::Hash128* out) {
  out->set_lo(h.lo);
  out->set_hi(h.hi);
}

std::string Bytes(int i, size_t n) {
  std::string v(n, '\0');
  std::mt19937 rng(i);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

// The value of a metric on `registry` with the given name and labels (-1: none such).
double MetricValue(prometheus::Registry& registry, const std::string& name,
                   const std::map<std::string, std::string>& want = {}) {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : metric.label) labels[l.name] = l.value;
      if (labels == want) return metric.counter.value;
    }
  }
  return -1;
}

// A raw Get with a destination: the status, the chunks by index, and the data bytes they carried.
struct RawGet {
  grpc::Status status;
  std::map<int, GetChunk> chunks;
  int64_t data_bytes = 0;
  int duplicates = 0;  // chunks for an index already seen
};

RawGet GetInto(ferry::v1::KvStore::Stub& stub, const std::vector<Hash128>& keys,
               const transfer::PeerDescriptor& destination) {
  auto ctx = NewClientContext(absl::Seconds(10));
  ferry::v1::GetRequest req;
  Set(kModel, req.mutable_model_fingerprint());
  for (const Hash128& k : keys) Set(k, req.add_block_hashes());
  *req.mutable_destination() = transfer::ToProto(destination);
  auto reader = stub.Get(ctx.get(), req);
  RawGet got;
  GetChunk c;
  while (reader->Read(&c)) {
    got.data_bytes += static_cast<int64_t>(c.data().size());
    if (!got.chunks.emplace(static_cast<int>(c.index()), c).second) ++got.duplicates;
  }
  got.status = reader->Finish();
  return got;
}

std::string TestStoreDir(const std::string& name) {
  return (fs::path(::testing::TempDir()) / name).string();
}

// Segments of 4 MiB, 64 MiB in all, objects up to 3 MiB unless said otherwise.
StoreOptions TestStoreOptions(int64_t segment_bytes = 4 << 20, int64_t max_object_bytes = 3 << 20) {
  StoreOptions o;
  o.segment_bytes = segment_bytes;
  o.capacity_bytes = 64 << 20;
  o.max_object_bytes = max_object_bytes;
  return o;
}

// A store on a fresh directory `name` under the test's temp dir (TestStoreOptions).
absl::StatusOr<std::unique_ptr<KvStore>> OpenTestStore(const std::string& name,
                                                       int64_t segment_bytes = 4 << 20,
                                                       int64_t max_object_bytes = 3 << 20) {
  const std::string dir = TestStoreDir(name);
  fs::remove_all(dir);
  return KvStore::Open(dir, TestStoreOptions(segment_bytes, max_object_bytes));
}

class KvServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name =
        "svc_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
    dir_ = TestStoreDir(name);
    store_ = *OpenTestStore(name);
    StartService();
  }
  void TearDown() override {
    server_.reset();
    service_.reset();
    store_.reset();
  }

  // Stops the node (server, service, store), lets `damage` change the store's directory, and
  // starts it again on it, with a fresh registry: what a restarted ferry-kvstore sees.
  void Restart(const std::function<void(const fs::path& dir)>& damage) {
    TearDown();
    damage(dir_);
    auto store = KvStore::Open(dir_, TestStoreOptions());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    StartService();
  }

  void StartService() {
    KvServiceOptions so;
    so.max_chunk_bytes = 1 << 20;
    so.max_keys = 100;
    so.capacity_bytes = 64 << 20;
    registry_ = std::make_shared<prometheus::Registry>();
    service_ = std::make_unique<KvStoreService>(store_.get(), so, registry_);
    GrpcServerOptions go;
    go.max_receive_message_bytes = MaxMessageBytes(so);
    go.max_send_message_bytes = MaxMessageBytes(so);
    server_ = *GrpcServer::Start(go, {service_.get()});
    ChannelOptions co;
    co.max_send_message_bytes = 8 << 20;  // lets the client send what the server must refuse
    stub_ = ferry::v1::KvStore::NewStub(NewChannel(server_->address(), co));
  }

  // Puts (key, bytes) objects in chunks of `chunk` bytes; returns the response.
  grpc::Status Put(const std::vector<std::pair<int, std::string>>& objects, size_t chunk,
                   ferry::v1::PutResponse* response, bool bad_checksum = false) {
    auto ctx = NewClientContext(absl::Seconds(10));
    auto writer = stub_->Put(ctx.get(), response);
    for (const auto& [i, bytes] : objects) {
      size_t offset = 0;
      do {
        PutChunk c;
        if (offset == 0) {
          ferry::v1::ObjectHeader* h = c.mutable_header();
          Set(Key(i), h->mutable_block_hash());
          Set(kModel, h->mutable_model_fingerprint());
          h->set_layout_tag(7);
          h->set_token_count(64);
          h->set_traffic_class(ferry::v1::TRAFFIC_CLASS_AGENT);
          h->set_retention_floor_seconds(FloorOf(i));
          h->set_size_bytes(bytes.size());
          h->set_checksum(Checksum(bytes) + (bad_checksum ? 1 : 0));
        }
        const size_t n = std::min(chunk, bytes.size() - offset);
        c.set_offset(offset);
        c.set_data(bytes.substr(offset, n));
        if (!writer->Write(c)) break;
        offset += n;
      } while (offset < bytes.size());
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // Gets keys; found objects reassembled by index.
  grpc::Status Get(const std::vector<int>& keys, std::map<int, std::string>* found,
                   const Hash128& model = kModel, uint32_t chunk = 0,
                   absl::Duration timeout = absl::Seconds(10), int* chunks = nullptr) {
    auto ctx = NewClientContext(timeout);
    ferry::v1::GetRequest req;
    Set(model, req.mutable_model_fingerprint());
    for (int k : keys) Set(Key(k), req.add_block_hashes());
    req.set_max_chunk_bytes(chunk);
    auto reader = stub_->Get(ctx.get(), req);
    GetChunk c;
    while (reader->Read(&c)) {
      if (chunks != nullptr) ++*chunks;
      const int k = keys[c.index()];
      if (c.offset() == 0 && !c.found()) continue;
      if (c.offset() == 0) {
        EXPECT_EQ(c.header().layout_tag(), 7u);
        EXPECT_EQ(c.header().traffic_class(), ferry::v1::TRAFFIC_CLASS_AGENT);
        EXPECT_EQ(c.header().retention_floor_seconds(), FloorOf(k));
        (*found)[k] = "";
      }
      EXPECT_EQ((*found)[k].size(), c.offset());
      (*found)[k] += c.data();
    }
    return reader->Finish();
  }

  std::string dir_;
  std::unique_ptr<KvStore> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<ferry::v1::KvStore::Stub> stub_;
};

TEST_F(KvServiceTest, EveryOperationThroughTheWire) {
  const std::string big = Bytes(3, (3 << 20) - 5);  // three chunks each way
  ferry::v1::PutResponse put;
  ASSERT_TRUE(Put({{1, ""}, {2, Bytes(2, 100)}, {3, big}}, 1 << 20, &put).ok());
  EXPECT_EQ(put.stored(), 3u);
  EXPECT_EQ(put.rejections_size(), 0);

  std::map<int, std::string> found;
  int chunks = 0;
  ASSERT_TRUE(Get({1, 2, 3, 4}, &found, kModel, 1 << 20, absl::Seconds(10), &chunks).ok());
  EXPECT_EQ(chunks, 1 + 1 + 3 + 1);
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[1], "");
  EXPECT_EQ(found[2], Bytes(2, 100));
  EXPECT_EQ(found[3], big);
  // Another model's fingerprint: misses.
  found.clear();
  ASSERT_TRUE(Get({2, 3}, &found, Xxh3Hash128("other")).ok());
  EXPECT_TRUE(found.empty());

  ferry::v1::ExistsRequest ex;
  Set(kModel, ex.mutable_model_fingerprint());
  for (int k : {1, 2, 4, 3}) Set(Key(k), ex.add_block_hashes());
  ferry::v1::ExistsResponse exr;
  auto ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Exists(ctx.get(), ex, &exr).ok());
  EXPECT_EQ(exr.longest_present_prefix(), 2u);
  EXPECT_EQ(std::vector<bool>(exr.present_flags().begin(), exr.present_flags().end()),
            std::vector<bool>({true, true, false, true}));
  // The present objects' floors, as put (0 for the absent one).
  EXPECT_EQ(std::vector<uint32_t>(exr.retention_floor_seconds().begin(),
                                  exr.retention_floor_seconds().end()),
            std::vector<uint32_t>({FloorOf(1), FloorOf(2), 0, FloorOf(3)}));
  EXPECT_EQ(store_->Get({Key(3)}, kModel)[0].meta.retention_floor_s, FloorOf(3));

  ferry::v1::DeleteRequest del;
  Set(Key(2), del.add_block_hashes());
  Set(Key(9), del.add_block_hashes());
  ferry::v1::DeleteResponse delr;
  ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Delete(ctx.get(), del, &delr).ok());
  EXPECT_EQ(delr.deleted(), 1u);
  found.clear();
  ASSERT_TRUE(Get({2}, &found).ok());
  EXPECT_TRUE(found.empty());

  ferry::v1::StatsResponse stats;
  ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Stats(ctx.get(), ferry::v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.objects(), 2u);
  EXPECT_EQ(stats.bytes(), big.size());
  EXPECT_EQ(stats.capacity_bytes(), 64u << 20);
  ASSERT_EQ(stats.classes_size(), kNumTrafficClasses);
  EXPECT_EQ(stats.classes(1).traffic_class(), ferry::v1::TRAFFIC_CLASS_AGENT);
  EXPECT_EQ(stats.classes(1).objects(), 2u);
  EXPECT_EQ(stats.classes(1).retention_seconds(), 3u * 24 * 3600);
  EXPECT_EQ(stats.classes(1).age_bucket_counts(0), 2u);
  EXPECT_GE(stats.hits(), 3u);
  EXPECT_EQ(stats.fingerprint_mismatches(), 2u);

  ferry::v1::VerifyResponse verify;
  ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Verify(ctx.get(), ferry::v1::VerifyRequest(), &verify).ok());
  EXPECT_EQ(verify.objects_checked(), 2u);
  EXPECT_EQ(verify.corrupt(), 0u);
  ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Compact(ctx.get(), ferry::v1::CompactRequest(), &stats).ok());
  EXPECT_EQ(stats.objects(), 2u);

  // Metrics: lookups by class and result, bytes by class.
  int64_t hits = -1;
  for (const auto& family : registry_->Collect()) {
    if (family.name != "ferry_kvstore_lookups_total") continue;
    for (const auto& metric : family.metric) {
      std::map<std::string, std::string> labels;
      for (const auto& l : metric.label) labels[l.name] = l.value;
      if (labels["class"] == "agent" && labels["result"] == "hit") {
        hits = static_cast<int64_t>(metric.counter.value);
      }
    }
  }
  EXPECT_EQ(hits, 3);
}

TEST_F(KvServiceTest, BadObjectsAreRejectedWithReasonsAndTheRestStored) {
  ferry::v1::PutResponse put;
  // Over the store's 3 MiB limit, and a checksum that does not match.
  ASSERT_TRUE(Put({{1, Bytes(1, (3 << 20) + 1)}, {2, Bytes(2, 10)}}, 1 << 20, &put).ok());
  EXPECT_EQ(put.stored(), 1u);
  ASSERT_EQ(put.rejections_size(), 1);
  EXPECT_NE(put.rejections(0).reason().find("larger than the store's limit"), std::string::npos);
  put.Clear();
  ASSERT_TRUE(Put({{5, Bytes(5, 1000)}}, 1 << 20, &put, /*bad_checksum=*/true).ok());
  EXPECT_EQ(put.stored(), 0u);
  ASSERT_EQ(put.rejections_size(), 1);
  EXPECT_NE(put.rejections(0).reason().find("checksum"), std::string::npos);
  std::map<int, std::string> found;
  ASSERT_TRUE(Get({1, 2, 5}, &found).ok());
  EXPECT_EQ(found.size(), 1u);

  // Data without a header before it, and too many keys: invalid requests.
  {
    auto ctx = NewClientContext(absl::Seconds(5));
    ferry::v1::PutResponse r;
    auto writer = stub_->Put(ctx.get(), &r);
    PutChunk c;
    c.set_data("stray");
    writer->Write(c);
    writer->WritesDone();
    const grpc::Status s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  }
  std::vector<int> many(101);
  found.clear();
  const grpc::Status s = Get(many, &found);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("at most 100"), std::string::npos) << s.error_message();
}

TEST_F(KvServiceTest, APutSaysWhatWasAlreadyPresentAndWhichBytesConflict) {
  EXPECT_EQ(MetricValue(*registry_, "ferry_kvstore_key_conflicts_total"), 0);
  ferry::v1::PutResponse put;
  ASSERT_TRUE(Put({{1, Bytes(1, 5000)}}, 1 << 20, &put).ok());
  EXPECT_EQ(put.stored(), 1u);
  EXPECT_EQ(put.already_present(), 0u);
  // Object 1 again with the same bytes, and a new one: both durable, one already present.
  put.Clear();
  ASSERT_TRUE(Put({{1, Bytes(1, 5000)}, {2, Bytes(2, 5000)}}, 1 << 20, &put).ok());
  EXPECT_EQ(put.stored(), 2u);
  EXPECT_EQ(put.already_present(), 1u);
  EXPECT_EQ(put.conflicting_block_hashes_size(), 0);
  EXPECT_EQ(MetricValue(*registry_, "ferry_kvstore_key_conflicts_total"), 0);
  // Object 1 with other bytes: present, a conflict; the node keeps and serves the first bytes.
  put.Clear();
  ASSERT_TRUE(Put({{1, Bytes(7, 5000)}}, 1 << 20, &put).ok());
  EXPECT_EQ(put.stored(), 1u);
  EXPECT_EQ(put.already_present(), 1u);
  ASSERT_EQ(put.conflicting_block_hashes_size(), 1);
  EXPECT_EQ(put.conflicting_block_hashes(0).lo(), Key(1).lo);
  EXPECT_EQ(put.conflicting_block_hashes(0).hi(), Key(1).hi);
  std::map<int, std::string> found;
  ASSERT_TRUE(Get({1}, &found).ok());
  EXPECT_TRUE(found[1] == Bytes(1, 5000));
  EXPECT_EQ(MetricValue(*registry_, "ferry_kvstore_key_conflicts_total"), 1);
  ferry::v1::StatsResponse stats;
  auto ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Stats(ctx.get(), ferry::v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.already_present(), 2u);
  EXPECT_EQ(stats.key_conflicts(), 1u);
  EXPECT_EQ(stats.puts(), 2u);
}

TEST_F(KvServiceTest, WhatTheStoreSkippedAtStartUpShowsInStatsVerifyAndMetrics) {
  const std::vector<std::string> reasons = {"torn_tail", "checksum", "header"};
  auto dropped = [&](const std::string& reason) {
    return MetricValue(*registry_, "ferry_kvstore_recovery_dropped_objects_total",
                       {{"reason", reason}});
  };
  for (const std::string& r : reasons) EXPECT_EQ(dropped(r), 0) << r;  // present from the start
  ferry::v1::PutResponse put;
  const size_t bytes = 100000;
  ASSERT_TRUE(
      Put({{1, Bytes(1, bytes)}, {2, Bytes(2, bytes)}, {3, Bytes(3, bytes)}, {4, Bytes(4, bytes)}},
          1 << 20, &put)
          .ok());
  ASSERT_EQ(put.stored(), 4u);
  // The four records of the open segment: a value byte of the second changed (the third, intact,
  // is kept), the fourth cut.
  const uint64_t record = AlignUp(kRecordHeaderBytes + bytes);
  const std::string segment = SegmentFileName(0);
  Restart([&](const fs::path& dir) {
    const fs::path file = dir / segment;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(kSegmentHeaderBytes + record + kRecordHeaderBytes);
    f.seekg(at);
    const char c = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x10));
    f.close();
    fs::resize_file(file, kSegmentHeaderBytes + 3 * record + 7000);
  });
  EXPECT_EQ(dropped("torn_tail"), 1);
  EXPECT_EQ(dropped("checksum"), 1);
  EXPECT_EQ(dropped("header"), 0);

  ferry::v1::StatsResponse stats;
  auto ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Stats(ctx.get(), ferry::v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.objects(), 2u);
  EXPECT_EQ(stats.recovery_dropped().torn_tail(), 1u);
  EXPECT_EQ(stats.recovery_dropped().checksum(), 1u);
  EXPECT_EQ(stats.recovery_dropped().header(), 0u);
  EXPECT_EQ(stats.torn_bytes_dropped(), 7000u);

  ferry::v1::VerifyResponse verify;
  ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(stub_->Verify(ctx.get(), ferry::v1::VerifyRequest(), &verify).ok());
  EXPECT_EQ(verify.corrupt(), 0u);
  EXPECT_EQ(verify.objects_checked(), 2u);
  EXPECT_EQ(verify.recovery_dropped().torn_tail(), 1u);
  EXPECT_EQ(verify.recovery_dropped().checksum(), 1u);
  EXPECT_EQ(verify.recovery_dropped().header(), 0u);
  ASSERT_EQ(verify.problems_size(), 2);
  EXPECT_NE(verify.problems(0).find(absl::StrCat(segment, " at ", kSegmentHeaderBytes + record,
                                                 ": checksum: 1 record dropped")),
            std::string::npos)
      << verify.problems(0);
  EXPECT_NE(verify.problems(1).find(absl::StrCat(segment, " at ", kSegmentHeaderBytes + 3 * record,
                                                 ": torn_tail: 1 record dropped")),
            std::string::npos)
      << verify.problems(1);

  // The exposition: counters with HELP and TYPE, every reason listed.
  const std::string text = prometheus::TextSerializer().Serialize(registry_->Collect());
  for (const char* line : {
           "# HELP ferry_kvstore_recovery_dropped_objects_total ",
           "# TYPE ferry_kvstore_recovery_dropped_objects_total counter\n",
           "ferry_kvstore_recovery_dropped_objects_total{reason=\"torn_tail\"} 1\n",
           "ferry_kvstore_recovery_dropped_objects_total{reason=\"checksum\"} 1\n",
           "ferry_kvstore_recovery_dropped_objects_total{reason=\"header\"} 0\n",
           "# HELP ferry_kvstore_key_conflicts_total ",
           "# TYPE ferry_kvstore_key_conflicts_total counter\n",
           "ferry_kvstore_key_conflicts_total 0\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " not in\n" << text;
  }
  if (const char* out = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::ofstream(fs::path(out) / "metrics.txt") << text;  // for promtool check metrics
  }
}

TEST_F(KvServiceTest, OversizedMessagesAreRefusedBeforeAHandler) {
  // A 2 MiB chunk to a server whose messages are bounded at 1 MiB + 64 KiB.
  ferry::v1::PutResponse put;
  const grpc::Status s = Put({{1, Bytes(1, 2 << 20)}}, 2 << 20, &put);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  std::map<int, std::string> found;
  ASSERT_TRUE(Get({1}, &found).ok());
  EXPECT_TRUE(found.empty());
}

TEST_F(KvServiceTest, DeadlinesAreHonoured) {
  ferry::v1::PutResponse put;
  std::vector<std::pair<int, std::string>> objects;
  for (int i = 0; i < 40; ++i) objects.emplace_back(i, Bytes(i, 1 << 20));
  ASSERT_TRUE(Put(objects, 1 << 20, &put).ok());
  // 40 MiB cannot stream in a millisecond: the call ends with DEADLINE_EXCEEDED, promptly.
  std::vector<int> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(i);
  std::map<int, std::string> found;
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status s = Get(keys, &found, kModel, 0, absl::Milliseconds(1));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_LT(found.size(), 40u);
}

// With a shared token, every method refuses a call without it, or with another, before touching
// the store (nothing is written); the token opens them all, through the client too. The health
// service stays open for probes.
TEST(KvServiceAuthTest, EveryMethodWantsTheSharedToken) {
  auto opened = OpenTestStore("svc_auth");
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<KvStore> store = *std::move(opened);
  const std::string token = "kv-token-0123456789abcdef";
  KvServiceOptions so;
  so.auth_token = SharedToken(token);
  KvStoreService service(store.get(), so);
  auto server = *GrpcServer::Start(GrpcServerOptions(), {&service});
  auto stub = ferry::v1::KvStore::NewStub(NewChannel(server->address()));

  auto call_all = [&](const std::string& presented) {
    std::vector<grpc::StatusCode> codes;
    auto ctx = [&] {
      auto c = NewClientContext(absl::Seconds(5));
      AttachSharedToken(c.get(), SharedToken(presented));
      return c;
    };
    ferry::v1::ExistsRequest exists;
    Set(kModel, exists.mutable_model_fingerprint());
    Set(Key(1), exists.add_block_hashes());
    ferry::v1::ExistsResponse exists_response;
    codes.push_back(stub->Exists(ctx().get(), exists, &exists_response).error_code());
    ferry::v1::GetRequest get;
    Set(kModel, get.mutable_model_fingerprint());
    Set(Key(1), get.add_block_hashes());
    auto get_ctx = ctx();
    auto reader = stub->Get(get_ctx.get(), get);
    GetChunk chunk;
    while (reader->Read(&chunk)) {
    }
    codes.push_back(reader->Finish().error_code());
    ferry::v1::PutResponse put_response;
    auto put_ctx = ctx();
    auto writer = stub->Put(put_ctx.get(), &put_response);
    const std::string bytes = Bytes(1, 1000);
    PutChunk c;
    ferry::v1::ObjectHeader* h = c.mutable_header();
    Set(Key(1), h->mutable_block_hash());
    Set(kModel, h->mutable_model_fingerprint());
    h->set_token_count(64);
    h->set_traffic_class(ferry::v1::TRAFFIC_CLASS_CHAT);
    h->set_size_bytes(bytes.size());
    h->set_checksum(Checksum(bytes));
    c.set_data(bytes);
    writer->Write(c);
    writer->WritesDone();
    codes.push_back(writer->Finish().error_code());
    ferry::v1::DeleteRequest del;
    Set(Key(2), del.add_block_hashes());
    ferry::v1::DeleteResponse del_response;
    codes.push_back(stub->Delete(ctx().get(), del, &del_response).error_code());
    ferry::v1::StatsResponse stats;
    codes.push_back(stub->Stats(ctx().get(), ferry::v1::StatsRequest(), &stats).error_code());
    ferry::v1::VerifyResponse verify;
    codes.push_back(stub->Verify(ctx().get(), ferry::v1::VerifyRequest(), &verify).error_code());
    codes.push_back(stub->Compact(ctx().get(), ferry::v1::CompactRequest(), &stats).error_code());
    return codes;
  };
  for (const std::string& wrong : {std::string(), std::string("kv-token-0123456789abcdeX")}) {
    for (grpc::StatusCode code : call_all(wrong)) {
      EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED) << "token '" << wrong << "'";
    }
  }
  EXPECT_EQ(store->Stats().objects, 0) << "an unauthenticated Put was stored";
  for (grpc::StatusCode code : call_all(token)) EXPECT_EQ(code, grpc::StatusCode::OK);
  EXPECT_EQ(store->Stats().objects, 1);

  // The client: with the token its objects go in and come back; without, every call is a miss.
  const std::string value = Bytes(3, 4096);
  ClientObject object{Key(3), ObjectMeta{kModel, 7, 64, TrafficClass::kAgent}, value};
  ClientOptions co;
  co.nodes = {server->address()};
  auto anonymous = *KvClient::Create(co);
  EXPECT_EQ(anonymous->Put({object}), 0);
  co.auth_token = SharedToken(token);
  auto client = *KvClient::Create(co);
  EXPECT_EQ(client->Put({object}), 1);
  auto got = client->Get({Key(3)}, kModel);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].found);
  EXPECT_EQ(got[0].value, value);
  EXPECT_FALSE(anonymous->Get({Key(3)}, kModel)[0].found);

  // Probes carry no token.
  auto health = grpc::health::v1::Health::NewStub(NewChannel(server->address()));
  grpc::health::v1::HealthCheckRequest check;
  grpc::health::v1::HealthCheckResponse serving;
  auto health_ctx = NewClientContext(absl::Seconds(5));
  ASSERT_TRUE(health->Check(health_ctx.get(), check, &serving).ok());
  EXPECT_EQ(serving.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  server.reset();
}

struct TransportParam {
  std::string kind;
  std::string ucx_tls;
};

std::string ParamName(const testing::TestParamInfo<TransportParam>& info) {
  return info.param.ucx_tls.empty() ? info.param.kind : info.param.kind + "_" + info.param.ucx_tls;
}

// A node with a KV transport of its own and a 2 MiB staging area, and a "worker" transport of the
// same kind owning the memory values are put into.
class KvServiceTransportTest : public testing::TestWithParam<TransportParam> {
 protected:
  static constexpr int64_t kStagingBytes = 2 << 20;

  transfer::TransportOptions Options() const {
    transfer::TransportOptions o;
    o.kind = GetParam().kind;
    o.ucx_tls = GetParam().ucx_tls;
    return o;
  }

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<transfer::KvTransport>> worker =
        transfer::KvTransport::Create(Options());
    if (!worker.ok() && GetParam().kind == "ucx" &&
        (worker.status().code() == absl::StatusCode::kUnavailable ||
         worker.status().code() == absl::StatusCode::kUnimplemented)) {
      // Under CI a transport this machine cannot run is a broken install, not a skip.
      const char* ci = std::getenv("CI");
      ASSERT_FALSE(ci != nullptr && std::string(ci) == "true")
          << "UCX (" << GetParam().ucx_tls << ") unusable under CI=true: " << worker.status();
      GTEST_SKIP() << "UCX (" << GetParam().ucx_tls << ") unusable here: " << worker.status();
    }
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = *std::move(worker);
    absl::StatusOr<std::unique_ptr<transfer::KvTransport>> node =
        transfer::KvTransport::Create(Options());
    ASSERT_TRUE(node.ok()) << node.status();
    node_transport_ = *std::move(node);

    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // "Test/0"
    auto store = OpenTestStore("svc_transport_" + name, 8 << 20, 4 << 20);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    KvServiceOptions so;
    so.transport = node_transport_.get();
    so.staging_bytes = kStagingBytes;
    registry_ = std::make_shared<prometheus::Registry>();
    auto service = KvStoreService::Create(store_.get(), so, registry_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    auto server = GrpcServer::Start(GrpcServerOptions(), {service_.get()});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = ferry::v1::KvStore::NewStub(NewChannel(server_->address()));
    node_regions_ = node_transport_->registered_regions();
  }

  void TearDown() override {
    server_.reset();
    service_.reset();
    // The service gave its staging area back.
    if (node_transport_ != nullptr) {
      EXPECT_EQ(node_transport_->registered_regions(), node_regions_ - 1);
    }
    node_transport_.reset();
    store_.reset();
    if (worker_ != nullptr && region_.id != 0) {
      EXPECT_TRUE(worker_->Deregister(region_.id).ok());
    }
    worker_.reset();
  }

  // Stores (key i, Bytes(i, size)) for each entry through the client.
  void Store(const std::map<int, size_t>& objects) {
    ClientOptions co;
    co.nodes = {server_->address()};
    co.deadline = absl::Seconds(10);
    auto client = KvClient::Create(co);
    ASSERT_TRUE(client.ok()) << client.status();
    std::vector<std::string> values;
    for (const auto& [i, size] : objects) values.push_back(Bytes(i, size));
    std::vector<ClientObject> items;
    size_t v = 0;
    for (const auto& [i, size] : objects) {
      items.push_back({Key(i), ObjectMeta{kModel, 7, 64, TrafficClass::kAgent}, values[v++]});
    }
    ASSERT_EQ((*client)->Put(items), static_cast<int64_t>(items.size()));
  }

  // Worker memory for one span per size (registered with the worker transport, filled with
  // 0xAB) and its descriptor, one block slice per span.
  void Destination(const std::vector<size_t>& sizes) {
    size_t total = 0;
    for (size_t n : sizes) total += std::max<size_t>(n, 1);
    auto region = worker_->Allocate(total);
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = *region;
    char* base = static_cast<char*>(region_.span.address);
    std::memset(base, 0xAB, total);
    descriptor_ = transfer::PeerDescriptor();
    descriptor_.kind = std::string(worker_->kind());
    descriptor_.address = worker_->address();
    descriptor_.regions = {region_.descriptor};
    spans_.clear();
    size_t offset = 0;
    for (size_t n : sizes) {
      spans_.push_back(absl::Span<char>(base + offset, n));
      descriptor_.block_slices.push_back({0, offset, n});
      offset += std::max<size_t>(n, 1);
    }
  }

  std::string Span(size_t i) const { return std::string(spans_[i].data(), spans_[i].size()); }

  double Puts(const std::string& outcome) {
    return MetricValue(*registry_, "ferry_kvstore_transport_puts_total", {{"outcome", outcome}});
  }

  std::unique_ptr<transfer::KvTransport> worker_;
  std::unique_ptr<transfer::KvTransport> node_transport_;
  std::unique_ptr<KvStore> store_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<ferry::v1::KvStore::Stub> stub_;
  int64_t node_regions_ = 0;
  transfer::LocalRegion region_;
  transfer::PeerDescriptor descriptor_;
  std::vector<absl::Span<char>> spans_;
};

TEST_P(KvServiceTransportTest, ValuesLandInTheDestinationAndTheStreamCarriesHeadersOnly) {
  Store({{1, 100}, {2, 1 << 20}, {3, (1 << 20) + 3}, {4, 4096}, {5, 3 << 20}});
  // 6 is absent; 4's slice is one byte short; 5 is larger than the 2 MiB staging area.
  Destination({100, 1 << 20, (1 << 20) + 3, 100, 4095, 3 << 20});
  const double read_before = MetricValue(*registry_, "ferry_kvstore_read_bytes_total");
  const RawGet got = GetInto(*stub_, {Key(1), Key(2), Key(3), Key(6), Key(4), Key(5)}, descriptor_);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.data_bytes, 0);
  EXPECT_EQ(got.duplicates, 0);
  ASSERT_EQ(got.chunks.size(), 6u);
  const std::vector<std::pair<int, size_t>> found = {{1, 100}, {2, 1 << 20}, {3, (1 << 20) + 3}};
  for (size_t i = 0; i < found.size(); ++i) {
    const GetChunk& c = got.chunks.at(static_cast<int>(i));
    ASSERT_TRUE(c.found()) << i;
    const std::string want = Bytes(found[i].first, found[i].second);
    EXPECT_EQ(c.header().size_bytes(), want.size());
    EXPECT_EQ(c.header().checksum(), Checksum(want));
    EXPECT_EQ(c.header().layout_tag(), 7u);
    EXPECT_EQ(c.header().token_count(), 64u);
    EXPECT_EQ(c.header().block_hash().lo(), Key(found[i].first).lo);
    EXPECT_TRUE(Span(i) == want) << "value " << i << " is not bit-exact in the destination";
  }
  for (int i : {3, 4, 5}) EXPECT_FALSE(got.chunks.at(i).found()) << i;
  // What missed was not written.
  EXPECT_EQ(Span(4), std::string(4095, '\xAB'));
  EXPECT_EQ(Span(5), std::string(3 << 20, '\xAB'));
  EXPECT_EQ(Puts("ok"), 3);
  EXPECT_EQ(Puts("failed"), 2);  // the short slice and the value over the staging area
  EXPECT_EQ(MetricValue(*registry_, "ferry_kvstore_read_bytes_total") - read_before,
            100 + (1 << 20) + (1 << 20) + 3);

  // Again, many values through a staging area of two: slots come back and are reused.
  std::map<int, size_t> many;
  std::vector<Hash128> keys;
  std::vector<size_t> sizes;
  for (int i = 100; i < 124; ++i) {
    many[i] = (i % 3 + 1) << 19;  // 512 KiB .. 1.5 MiB
    keys.push_back(Key(i));
    sizes.push_back(many[i]);
  }
  Store(many);
  ASSERT_TRUE(worker_->Deregister(region_.id).ok());
  Destination(sizes);
  const RawGet all = GetInto(*stub_, keys, descriptor_);
  ASSERT_TRUE(all.status.ok()) << all.status.error_message();
  EXPECT_EQ(all.data_bytes, 0);
  ASSERT_EQ(all.chunks.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(all.chunks.at(static_cast<int>(i)).found()) << i;
    EXPECT_TRUE(Span(i) == Bytes(100 + static_cast<int>(i), sizes[i])) << i;
  }
  EXPECT_EQ(Puts("ok"), 3 + 24);
}

TEST_P(KvServiceTransportTest, TheClientsGetIntoUsesTheNodesTransport) {
  Store({{1, 100}, {2, 1 << 20}, {3, 5000}});
  Destination({100, 1 << 20, 5000, 64});
  ClientOptions co;
  co.nodes = {server_->address()};
  co.deadline = absl::Seconds(10);
  auto client = KvClient::Create(co);
  ASSERT_TRUE(client.ok()) << client.status();
  GetIntoDestination destination;
  destination.spans = spans_;
  destination.descriptor = descriptor_;
  const std::vector<GetIntoResult> got =
      (*client)->GetInto({Key(1), Key(2), Key(3), Key(9)}, kModel, destination);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_TRUE(got[0].found);
  EXPECT_TRUE(got[1].found);
  EXPECT_TRUE(got[2].found);
  EXPECT_FALSE(got[3].found);
  EXPECT_EQ(got[1].meta.layout_tag, 7u);
  EXPECT_EQ(got[1].meta.traffic_class, TrafficClass::kAgent);
  EXPECT_TRUE(Span(0) == Bytes(1, 100));
  EXPECT_TRUE(Span(1) == Bytes(2, 1 << 20));
  EXPECT_TRUE(Span(2) == Bytes(3, 5000));
  EXPECT_EQ(Puts("ok"), 3);  // by the node's transport, not in the stream

  // A descriptor whose slices are not the spans is a bad destination: every key a miss.
  destination.descriptor->block_slices[1].offset += 64;
  for (const GetIntoResult& r :
       (*client)->GetInto({Key(1), Key(2), Key(3), Key(9)}, kModel, destination)) {
    EXPECT_FALSE(r.found);
  }
  destination.descriptor = descriptor_;
  destination.descriptor->block_slices.pop_back();
  for (const GetIntoResult& r :
       (*client)->GetInto({Key(1), Key(2), Key(3), Key(9)}, kModel, destination)) {
    EXPECT_FALSE(r.found);
  }
  EXPECT_EQ(Puts("ok"), 3);
  EXPECT_TRUE((*client)->nodes()[0].up);
}

TEST_P(KvServiceTransportTest, BadDescriptorsAreInvalidArguments) {
  Store({{1, 100}});
  Destination({100, 100});
  // One slice too many for the keys.
  RawGet got = GetInto(*stub_, {Key(1)}, descriptor_);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(got.status.error_message().find("2 block slices for 1 blocks"), std::string::npos)
      << got.status.error_message();
  EXPECT_TRUE(got.chunks.empty());
  // A slice past its region's end.
  transfer::PeerDescriptor outside = descriptor_;
  outside.block_slices = {{0, region_.descriptor.length - 10, 100}};
  got = GetInto(*stub_, {Key(1)}, outside);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // No address.
  transfer::PeerDescriptor nowhere = descriptor_;
  nowhere.address.clear();
  nowhere.block_slices.pop_back();
  got = GetInto(*stub_, {Key(1)}, nowhere);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // The other kind of transport: this node cannot serve it that way.
  transfer::PeerDescriptor other = descriptor_;
  other.kind = GetParam().kind == "grpc" ? "ucx" : "grpc";
  other.block_slices.pop_back();
  got = GetInto(*stub_, {Key(1)}, other);
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << got.status.error_message();
  EXPECT_EQ(Puts("ok"), 0);
  EXPECT_EQ(Span(0), std::string(100, '\xAB'));
}

INSTANTIATE_TEST_SUITE_P(Transports, KvServiceTransportTest,
                         testing::Values(TransportParam{"grpc", ""}, TransportParam{"ucx", "tcp"}),
                         ParamName);

// A node without a transport refuses a Get into a descriptor with FAILED_PRECONDITION, and the
// client's GetInto asks it again for the bytes, which land in the same spans.
TEST_F(KvServiceTest, WithoutATransportGetIntoFallsBackToBytes) {
  ferry::v1::PutResponse put;
  ASSERT_TRUE(Put({{1, Bytes(1, 100)}, {2, Bytes(2, (2 << 20) + 1)}}, 1 << 20, &put).ok());
  ASSERT_EQ(put.stored(), 2u);
  auto worker = transfer::KvTransport::Create({.kind = "grpc"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto region = (*worker)->Allocate(100 + (2 << 20) + 1);
  ASSERT_TRUE(region.ok()) << region.status();
  char* base = static_cast<char*>(region->span.address);
  std::memset(base, 0, region->span.length);
  transfer::PeerDescriptor descriptor;
  descriptor.kind = "grpc";
  descriptor.address = (*worker)->address();
  descriptor.regions = {region->descriptor};
  descriptor.block_slices = {{0, 0, 100}, {0, 100, (2 << 20) + 1}};

  const RawGet raw = GetInto(*stub_, {Key(1), Key(2)}, descriptor);
  EXPECT_EQ(raw.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(raw.status.error_message().find("ask without a destination"), std::string::npos)
      << raw.status.error_message();
  EXPECT_TRUE(raw.chunks.empty());

  ClientOptions co;
  co.nodes = {server_->address()};
  co.deadline = absl::Seconds(10);
  auto client = KvClient::Create(co);
  ASSERT_TRUE(client.ok()) << client.status();
  GetIntoDestination destination;
  destination.spans = {absl::Span<char>(base, 100), absl::Span<char>(base + 100, (2 << 20) + 1)};
  destination.descriptor = descriptor;
  const std::vector<GetIntoResult> got = (*client)->GetInto({Key(1), Key(2)}, kModel, destination);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].found);
  EXPECT_TRUE(got[1].found);
  EXPECT_TRUE(std::string(base, 100) == Bytes(1, 100));
  EXPECT_TRUE(std::string(base + 100, (2 << 20) + 1) == Bytes(2, (2 << 20) + 1));
  EXPECT_TRUE((*client)->nodes()[0].up);  // a refusal is not a node failure
  EXPECT_EQ(MetricValue(*registry_, "ferry_kvstore_transport_puts_total", {{"outcome", "ok"}}),
            -1);  // no such metric without a transport
  EXPECT_TRUE((*worker)->Deregister(region->id).ok());
}

// Create: a transport needs a positive staging area; the constructor takes none.
TEST(KvServiceCreateTest, StagingNeedsAPositiveSize) {
  auto store = OpenTestStore("svc_create");
  ASSERT_TRUE(store.ok()) << store.status();
  auto transport = transfer::KvTransport::Create({.kind = "grpc"});
  ASSERT_TRUE(transport.ok()) << transport.status();
  KvServiceOptions so;
  so.transport = transport->get();
  so.staging_bytes = 0;
  EXPECT_EQ(KvStoreService::Create(store->get(), so).status().code(),
            absl::StatusCode::kInvalidArgument);
  so.staging_bytes = 1 << 20;
  auto service = KvStoreService::Create(store->get(), so);
  ASSERT_TRUE(service.ok()) << service.status();
  EXPECT_EQ((*transport)->registered_regions(), 1);
  service->reset();
  EXPECT_EQ((*transport)->registered_regions(), 0);
  so.transport = nullptr;
  EXPECT_TRUE(KvStoreService::Create(store->get(), so).ok());
}

}  // namespace
}  // namespace kv
}  // namespace ferry
