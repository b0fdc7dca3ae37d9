// The KV store service on loopback: every library behaviour through the wire (put in chunks,
// get in chunks, exists, delete, stats, verify, compact), rejections with reasons, oversized
// messages refused with a clear status, deadlines honoured, and the metrics.

#include "kvstore/service/kv_service.h"

#include <filesystem>
#include <random>

#include "ferry/v1/kvstore.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "kvstore/client/kv_client.h"
#include "services/common/grpc_client.h"
#include "services/common/grpc_server.h"
#include "services/common/shared_token.h"

namespace ferry {
namespace kv {
namespace {

namespace fs = std::filesystem;
using ferry::v1::GetChunk;
using ferry::v1::PutChunk;

const Hash128 kModel = Xxh3Hash128("model");

Hash128 Key(int i) { return Xxh3Hash128("block " + std::to_string(i)); }

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

class KvServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::path(::testing::TempDir()) /
            ("svc_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
               .string();
    fs::remove_all(dir_);
    StoreOptions o;
    o.segment_bytes = 4 << 20;
    o.capacity_bytes = 64 << 20;
    o.max_object_bytes = 3 << 20;
    store_ = *KvStore::Open(dir_, o);
    KvServiceOptions so;
    so.max_chunk_bytes = 1 << 20;
    so.max_keys = 100;
    so.capacity_bytes = o.capacity_bytes;
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
  void TearDown() override {
    server_.reset();
    service_.reset();
    store_.reset();
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
  const std::string dir = (fs::path(::testing::TempDir()) / "svc_auth").string();
  fs::remove_all(dir);
  StoreOptions o;
  o.segment_bytes = 4 << 20;
  o.capacity_bytes = 64 << 20;
  o.max_object_bytes = 3 << 20;
  auto opened = KvStore::Open(dir, o);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<KvStore> store = *std::move(opened);
  const std::string token = "kv-token-0123456789abcdef";
  KvServiceOptions so;
  so.auth_token = token;
  KvStoreService service(store.get(), so);
  auto server = *GrpcServer::Start(GrpcServerOptions(), {&service});
  auto stub = ferry::v1::KvStore::NewStub(NewChannel(server->address()));

  auto call_all = [&](const std::string& presented) {
    std::vector<grpc::StatusCode> codes;
    auto ctx = [&] {
      auto c = NewClientContext(absl::Seconds(5));
      AttachSharedToken(c.get(), presented);
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
  co.auth_token = token;
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

}  // namespace
}  // namespace kv
}  // namespace ferry
