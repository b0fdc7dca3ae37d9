// The KV store's sharding client against real nodes in-process (KvStoreService over a KvStore in
// a temp directory, served on 127.0.0.1 port 0): placement (the exact hash bytes, determinism,
// spread, minimal movement), round trips with multi-chunk values, replication over a node that
// is down, misses and skipping for down nodes, probing and recovery of a node restarted on its
// port, slow nodes, request errors that are not node failures, and concurrent callers. GetInto:
// values bit-exact in caller spans (multi-chunk too), wrong-size spans, corrupt or foreign values
// from a fake node, a key found on its second replica, a node down, bad destinations; with a
// descriptor (nodes with a gRPC KV transport), a key of a node that failed mid-call is not asked
// of another replica in that call. Backoffs run on a FakeClock; gRPC deadlines on real time.

#include "kvstore/client/kv_client.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/fake_clock.h"
#include "ferry/v1/kvstore.grpc.pb.h"
#include "gtest/gtest.h"
#include "kvstore/client/dynamic_kv_client.h"
#include "kvstore/kv_store.h"
#include "kvstore/service/kv_service.h"
#include "kvstore/wire.h"
#include "services/common/grpc_server.h"
#include "services/transfer/kv_transport.h"
#include "services/transfer/transfer_wire.h"

namespace ferry {
namespace kv {
namespace {

namespace fs = std::filesystem;

const Hash128 kModel = Xxh3Hash128("model A");
const Hash128 kOtherModel = Xxh3Hash128("model B");

Hash128 Key(int i) { return Xxh3Hash128(absl::StrCat("key-", i)); }

// Bytes that depend on the index and the length only.
std::string Value(int i, size_t bytes) {
  std::string v(bytes, '\0');
  std::mt19937_64 rng(static_cast<uint64_t>(i) * 7919 + bytes);
  for (size_t j = 0; j < bytes; j += 8) {
    const uint64_t r = rng();
    std::memcpy(&v[j], &r, std::min<size_t>(8, bytes - j));
  }
  return v;
}

ObjectMeta Meta(int i) {
  ObjectMeta m;
  m.fingerprint = kModel;
  m.layout_tag = 0x1234'5678'9abc'def0ULL + static_cast<uint64_t>(i);  // needs all 64 bits
  m.token_count = 16 + static_cast<uint32_t>(i);
  m.traffic_class = static_cast<TrafficClass>(i % kNumTrafficClasses);
  m.retention_floor_s = i % 4 == 0 ? 0 : 300 * static_cast<uint32_t>(i % 4);
  return m;
}

// Objects 0..n-1: the first three are 0 B, 100 B and 3 MiB (three Put and Get chunks at the
// default 1 MiB), the rest `small` bytes.
struct Objects {
  std::vector<std::string> values;
  std::vector<ClientObject> objects;
  std::vector<Hash128> keys;

  Objects(int from, int to, size_t small = 100) {
    for (int i = from; i < to; ++i) {
      const size_t bytes = i == 0 ? 0 : i == 1 ? 100 : i == 2 ? size_t{3} << 20 : small;
      values.push_back(Value(i, bytes));
      keys.push_back(Key(i));
    }
    for (int i = from; i < to; ++i) {
      objects.push_back({Key(i), Meta(i), values[static_cast<size_t>(i - from)]});
    }
  }
};

void ExpectSameMeta(const ObjectMeta& a, const ObjectMeta& b) {
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.layout_tag, b.layout_tag);
  EXPECT_EQ(a.token_count, b.token_count);
  EXPECT_EQ(a.traffic_class, b.traffic_class);
  EXPECT_EQ(a.retention_floor_s, b.retention_floor_s);
}

// Forwards every call to the real service after `delay` (cut short when the call is cancelled,
// e.g. by its deadline): a slow node.
class DelayingService final : public ferry::v1::KvStore::Service {
 public:
  explicit DelayingService(ferry::v1::KvStore::Service* inner) : inner_(inner) {}

  void set_delay(absl::Duration delay) {
    absl::MutexLock lock(&mu_);
    delay_ = delay;
  }

  grpc::Status Exists(grpc::ServerContext* context, const ferry::v1::ExistsRequest* request,
                      ferry::v1::ExistsResponse* response) override {
    Wait(context);
    return inner_->Exists(context, request, response);
  }
  grpc::Status Get(grpc::ServerContext* context, const ferry::v1::GetRequest* request,
                   grpc::ServerWriter<ferry::v1::GetChunk>* writer) override {
    Wait(context);
    return inner_->Get(context, request, writer);
  }
  grpc::Status Put(grpc::ServerContext* context, grpc::ServerReader<ferry::v1::PutChunk>* reader,
                   ferry::v1::PutResponse* response) override {
    Wait(context);
    return inner_->Put(context, reader, response);
  }
  grpc::Status Delete(grpc::ServerContext* context, const ferry::v1::DeleteRequest* request,
                      ferry::v1::DeleteResponse* response) override {
    Wait(context);
    return inner_->Delete(context, request, response);
  }

 private:
  void Wait(grpc::ServerContext* context) {
    absl::Duration delay;
    {
      absl::MutexLock lock(&mu_);
      delay = delay_;
    }
    // Inherent: a slow node, measured against the client's real-time RPC deadline.
    const absl::Time end = absl::Now() + delay;
    while (absl::Now() < end && !context->IsCancelled()) absl::SleepFor(absl::Milliseconds(2));
  }

  ferry::v1::KvStore::Service* const inner_;
  absl::Mutex mu_;
  absl::Duration delay_ ABSL_GUARDED_BY(mu_);
};

// One ferry-kvstore node in-process: a store in `dir`, the service, a server.
class TestNode {
 public:
  // Serves the store in `dir` on `address` ("127.0.0.1:0": any free port), with `transport` (not
  // owned; may be null) for Gets into transfer descriptors.
  static std::unique_ptr<TestNode> Start(const std::string& dir,
                                         const std::string& address = "127.0.0.1:0",
                                         transfer::KvTransport* transport = nullptr) {
    auto node = std::unique_ptr<TestNode>(new TestNode(dir));
    StoreOptions options;
    options.segment_bytes = 16 << 20;  // holds the largest object
    options.capacity_bytes = 64 << 20;
    options.max_object_bytes = 8 << 20;
    auto store = KvStore::Open(dir, options);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    node->store_ = std::move(*store);
    KvServiceOptions service_options;
    service_options.transport = transport;
    service_options.staging_bytes = 8 << 20;
    auto service = KvStoreService::Create(node->store_.get(), service_options);
    EXPECT_TRUE(service.ok()) << service.status();
    if (!service.ok()) return nullptr;
    node->service_ = *std::move(service);
    node->delaying_ = std::make_unique<DelayingService>(node->service_.get());
    GrpcServerOptions server_options;
    server_options.address = address;
    auto server = GrpcServer::Start(server_options, {node->delaying_.get()});
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    node->server_ = std::move(*server);
    node->port_ = node->server_->port();
    return node;
  }

  ~TestNode() { Stop(); }

  // Shuts the server down at once (in-flight calls cancelled), then closes the store.
  void Stop() {
    if (server_ != nullptr) server_->Shutdown(absl::ZeroDuration());
    server_.reset();
    delaying_.reset();
    service_.reset();
    store_.reset();
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  KvStore& store() { return *store_; }
  void set_delay(absl::Duration delay) { delaying_->set_delay(delay); }

 private:
  explicit TestNode(std::string dir) : dir_(std::move(dir)) {}

  const std::string dir_;
  int port_ = 0;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<KvStoreService> service_;
  std::unique_ptr<DelayingService> delaying_;
  std::unique_ptr<GrpcServer> server_;
};

class KvClientTest : public ::testing::Test {
 protected:
  // `transport`: each node's own KV transport (null: none).
  void StartNodes(int n, transfer::KvTransport* const* transports = nullptr) {
    const fs::path base =
        fs::path(::testing::TempDir()) /
        absl::StrCat("kv_client_", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base);
    fs::create_directories(base);
    for (int i = 0; i < n; ++i) {
      auto node = TestNode::Start((base / absl::StrCat("node", i)).string(), "127.0.0.1:0",
                                  transports != nullptr ? transports[i] : nullptr);
      ASSERT_NE(node, nullptr);
      nodes_.push_back(std::move(node));
    }
  }

  // Stops node i and starts it again on the same port over the same directory.
  void RestartNode(int i) {
    const std::string dir = nodes_[i]->dir();
    const std::string address = nodes_[i]->address();
    nodes_[i].reset();
    nodes_[i] = TestNode::Start(dir, address);
    ASSERT_NE(nodes_[i], nullptr);
  }

  ClientOptions Options(int replication = 1) {
    ClientOptions options;
    for (const auto& node : nodes_) options.nodes.push_back(node->address());
    options.replication = replication;
    options.deadline = absl::Seconds(2);
    options.down_backoff = absl::Milliseconds(100);
    options.max_down_backoff = absl::Milliseconds(400);
    options.clock = &clock_;
    return options;
  }

  std::unique_ptr<KvClient> NewClient(const ClientOptions& options) {
    auto client = KvClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // Whether node i's own store holds key (asked directly, not through the client).
  bool NodeHas(int i, const Hash128& key) {
    return nodes_[i]->store().Exists({key}, kModel).present[0];
  }

  FakeClock clock_;
  std::vector<std::unique_ptr<TestNode>> nodes_;
};

// The score is XXH3-64 of key.lo (8 bytes LE), key.hi (8 bytes LE), the address: values from the
// Python reference, xxhash.xxh3_64_intdigest(struct.pack("<QQ", lo, hi) + address.encode()).
TEST(RendezvousTest, ScoreIsXxh3OfTheSpecifiedBytes) {
  EXPECT_EQ(RendezvousScore(Hash128{0, 0}, "127.0.0.1:7000"), 0xea77cc078a00a9ebULL);
  const Hash128 key{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  EXPECT_EQ(RendezvousScore(key, "kv-0:7400"), 0x8594234ac9f28f05ULL);
  EXPECT_EQ(RendezvousScore(key, "kv-1:7400"), 0x4193ac6802c2f607ULL);
  EXPECT_EQ(RendezvousScore(key, "kv-2:7400"), 0xe24641cae5955157ULL);

  ClientOptions options;
  options.nodes = {"kv-0:7400", "kv-1:7400", "kv-2:7400"};
  auto client = KvClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->NodesFor(key), (std::vector<int>{2, 0, 1}));
}

TEST(RendezvousTest, DeterministicEvenAndMovesOnlyTheRemovedNodesKeys) {
  ClientOptions three;
  three.nodes = {"kv-0:7400", "kv-1:7400", "kv-2:7400"};
  ClientOptions reversed;
  reversed.nodes = {"kv-2:7400", "kv-1:7400", "kv-0:7400"};
  ClientOptions two;
  two.nodes = {"kv-0:7400", "kv-2:7400"};
  auto a = KvClient::Create(three);
  auto b = KvClient::Create(three);
  auto r = KvClient::Create(reversed);
  auto c = KvClient::Create(two);
  ASSERT_TRUE(a.ok() && b.ok() && r.ok() && c.ok());

  constexpr int kKeys = 3000;
  std::vector<int> primaries(3, 0);
  int moved = 0;
  for (int i = 0; i < kKeys; ++i) {
    const std::vector<int> order = (*a)->NodesFor(Key(i));
    ASSERT_EQ(order.size(), 3u);
    EXPECT_EQ(std::vector<int>(order), (*b)->NodesFor(Key(i)));
    std::vector<int> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2}));
    ++primaries[order[0]];

    // By address, the order does not depend on how the list is ordered.
    std::vector<std::string> by_address, reversed_by_address;
    for (int n : order) by_address.push_back(three.nodes[n]);
    for (int n : (*r)->NodesFor(Key(i))) reversed_by_address.push_back(reversed.nodes[n]);
    EXPECT_EQ(by_address, reversed_by_address);

    // Without kv-1, every key keeps its order among the others: only kv-1's keys move.
    std::vector<std::string> without;
    for (const std::string& address : by_address) {
      if (address != "kv-1:7400") without.push_back(address);
    }
    std::vector<std::string> two_by_address;
    for (int n : (*c)->NodesFor(Key(i))) two_by_address.push_back(two.nodes[n]);
    EXPECT_EQ(without, two_by_address);
    if (by_address[0] != two_by_address[0]) {
      ++moved;
      EXPECT_EQ(by_address[0], "kv-1:7400");
    }
  }
  for (int n = 0; n < 3; ++n) {
    EXPECT_GE(primaries[n], kKeys * 28 / 100) << "node " << n;
    EXPECT_LE(primaries[n], kKeys * 38 / 100) << "node " << n;
  }
  EXPECT_EQ(moved, primaries[1]);
}

TEST(KvClientCreateTest, RejectsBadOptionsOnly) {
  ClientOptions ok;
  ok.nodes = {"a:1", "b:1", "c:1"};
  EXPECT_TRUE(KvClient::Create(ok).ok());
  ok.replication = 3;
  EXPECT_TRUE(KvClient::Create(ok).ok());

  auto bad = [&](auto change) {
    ClientOptions o;
    o.nodes = {"a:1", "b:1", "c:1"};
    change(o);
    return KvClient::Create(o).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad([](ClientOptions& o) { o.nodes.clear(); }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.nodes.push_back("a:1"); }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.nodes.push_back(""); }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.replication = 0; }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.replication = 4; }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.deadline = absl::ZeroDuration(); }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.down_backoff = absl::Seconds(10); }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.max_chunk_bytes = 0; }), kInvalid);
  EXPECT_EQ(bad([](ClientOptions& o) { o.max_chunk_bytes = int64_t{5} << 20; }), kInvalid);
}

TEST_F(KvClientTest, RoundTripAcrossThreeNodes) {
  StartNodes(3);
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  Objects o(0, 30);
  EXPECT_EQ(client->Put(o.objects), 30);

  // Each object is on its primary node and nowhere else; every node got some.
  std::vector<int> per_node(3, 0);
  for (const Hash128& key : o.keys) {
    const int primary = client->NodesFor(key)[0];
    ++per_node[primary];
    for (int n = 0; n < 3; ++n) EXPECT_EQ(NodeHas(n, key), n == primary);
  }
  for (int n = 0; n < 3; ++n) EXPECT_GT(per_node[n], 0) << "node " << n;

  const std::vector<ClientGetResult> got = client->Get(o.keys, kModel);
  ASSERT_EQ(got.size(), 30u);
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(got[i].found) << i;
    EXPECT_EQ(got[i].value, o.values[i]) << i;
    ExpectSameMeta(got[i].meta, Meta(i));
  }
  for (const ClientGetResult& r : client->Get(o.keys, kOtherModel)) EXPECT_FALSE(r.found);

  // Exists over a chain: a gap ends the prefix.
  const Hash128 absent = Key(1000);
  const ExistsResult e = client->Exists({Key(0), Key(1), Key(2), absent, Key(3)}, kModel);
  EXPECT_EQ(e.prefix, 3);
  EXPECT_EQ(e.present, (std::vector<bool>{true, true, true, false, true}));
  // The present objects' retention floors, as put.
  EXPECT_EQ(e.retention_floor_s, (std::vector<uint32_t>{0, 300, 600, 0, 900}));
  EXPECT_EQ(client->Exists({Key(0)}, kOtherModel).prefix, 0);

  // Smaller chunks: many Put messages, and Get asks for small ones too.
  ClientOptions small = Options();
  small.max_chunk_bytes = 64 << 10;
  auto small_client = NewClient(small);
  ASSERT_NE(small_client, nullptr);
  Objects big(2, 3);
  const Hash128 big_key = Key(2000);
  big.objects[0].key = big_key;
  EXPECT_EQ(small_client->Put(big.objects), 1);
  const auto big_got = small_client->Get({big_key}, kModel);
  ASSERT_TRUE(big_got[0].found);
  EXPECT_EQ(big_got[0].value, big.values[0]);
  EXPECT_EQ(client->Get({big_key}, kModel)[0].value, big.values[0]);

  // Delete: the deleted ones miss; the count is the keys that were present.
  EXPECT_EQ(client->Delete({Key(0), Key(1), absent}), 2);
  const auto after = client->Get({Key(0), Key(1), Key(2)}, kModel);
  EXPECT_FALSE(after[0].found);
  EXPECT_FALSE(after[1].found);
  EXPECT_TRUE(after[2].found);
  EXPECT_EQ(client->Exists({Key(0), Key(1), Key(2)}, kModel).present,
            (std::vector<bool>{false, false, true}));

  for (const NodeStatus& s : client->nodes()) {
    EXPECT_TRUE(s.up) << s.address;
    EXPECT_GT(s.requests, 0) << s.address;
    EXPECT_EQ(s.failures, 0) << s.address;
  }
  EXPECT_TRUE(client->Get({}, kModel).empty());
  EXPECT_EQ(client->Exists({}, kModel).prefix, 0);
  EXPECT_EQ(client->Put({}), 0);
}

TEST_F(KvClientTest, CallsOverTheServersKeyLimitGoInSlices) {
  // A node takes 65,536 keys per request: a chain of 70,000 goes as two, invisibly. (Calls this
  // large take seconds under ASan on a busy 2-core machine: the deadline is not what is tested.)
  StartNodes(1);
  ClientOptions options = Options();
  options.deadline = absl::Seconds(30);
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  Objects o(3, 8);
  ASSERT_EQ(client->Put(o.objects), 5);
  std::vector<Hash128> chain;
  for (int i = 0; i < 70000; ++i) chain.push_back(Key(100000 + i));
  for (int i = 0; i < 3; ++i) chain[i] = o.keys[i];  // present: the first three
  chain[65540] = o.keys[3];                          // and one in the second slice
  const ExistsResult e = client->Exists(chain, kModel);
  ASSERT_EQ(e.present.size(), chain.size());
  ASSERT_EQ(e.retention_floor_s.size(), chain.size());
  EXPECT_EQ(e.prefix, 3);
  EXPECT_TRUE(e.present[65540]);
  EXPECT_EQ(e.retention_floor_s[65540], Meta(6).retention_floor_s);
  int present = 0;
  for (bool p : e.present) present += p;
  EXPECT_EQ(present, 4);
  const std::vector<ClientGetResult> got = client->Get(chain, kModel);
  ASSERT_EQ(got.size(), chain.size());
  EXPECT_TRUE(got[65540].found);
  EXPECT_EQ(got[65540].value, o.values[3]);
  EXPECT_EQ(client->Delete(chain), 4);
  EXPECT_TRUE(client->nodes()[0].up);
}

TEST_F(KvClientTest, ReplicationServesEveryObjectWithANodeDown) {
  StartNodes(3);
  auto client = NewClient(Options(/*replication=*/2));
  ASSERT_NE(client, nullptr);
  Objects o(0, 30);
  EXPECT_EQ(client->Put(o.objects), 30);
  for (const Hash128& key : o.keys) {
    const std::vector<int> order = client->NodesFor(key);
    EXPECT_TRUE(NodeHas(order[0], key));
    EXPECT_TRUE(NodeHas(order[1], key));
    EXPECT_FALSE(NodeHas(order[2], key));
  }

  nodes_[1]->Stop();
  const absl::Time start = absl::Now();
  const auto got = client->Get(o.keys, kModel);
  const absl::Duration get_time = absl::Now() - start;
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(got[i].found) << i;
    EXPECT_EQ(got[i].value, o.values[i]) << i;
    ExpectSameMeta(got[i].meta, Meta(i));
  }
  const ExistsResult e = client->Exists(o.keys, kModel);
  EXPECT_EQ(e.prefix, 30);

  // New objects are durable on their surviving replica.
  Objects more(100, 120);
  EXPECT_EQ(client->Put(more.objects), 20);
  for (const ClientGetResult& r : client->Get(more.keys, kModel)) EXPECT_TRUE(r.found);

  const NodeStatus down = client->nodes()[1];
  EXPECT_FALSE(down.up);
  EXPECT_EQ(down.failures, 1);
  EXPECT_TRUE(client->nodes()[0].up);
  EXPECT_TRUE(client->nodes()[2].up);
  std::cerr << "replication 2, node down: Get of 30 objects (3 MiB among them) took " << get_time
            << "\n";
}

TEST_F(KvClientTest, ExistsReportsTheLowestFloorOfTheReplicasThatHaveAKey) {
  StartNodes(2);
  auto client = NewClient(Options(/*replication=*/2));
  ASSERT_NE(client, nullptr);
  Objects o(4, 7);  // floors 0, 300, 600
  EXPECT_EQ(client->Put(o.objects), 3);
  EXPECT_EQ(client->Exists(o.keys, kModel).retention_floor_s, (std::vector<uint32_t>{0, 300, 600}));
  // Through the client, a higher floor writes the objects again on both replicas.
  for (ClientObject& obj : o.objects) obj.meta.retention_floor_s = 3600;
  EXPECT_EQ(client->Put(o.objects), 3);
  EXPECT_EQ(client->Exists(o.keys, kModel).retention_floor_s,
            (std::vector<uint32_t>{3600, 3600, 3600}));
  const auto got = client->Get(o.keys, kModel);
  for (const ClientGetResult& r : got) EXPECT_EQ(r.meta.retention_floor_s, 3600u);
  // One replica with a longer floor than the other: the lower one counts.
  ObjectMeta meta = Meta(8);
  meta.retention_floor_s = 300;
  ASSERT_TRUE(nodes_[0]->store().Put({{Key(8), meta, "v"}}).ok());
  meta.retention_floor_s = 7200;
  ASSERT_TRUE(nodes_[1]->store().Put({{Key(8), meta, "v"}}).ok());
  // Present on one replica only: its floor.
  meta.retention_floor_s = 900;
  ASSERT_TRUE(nodes_[1]->store().Put({{Key(9), meta, "v"}}).ok());
  const ExistsResult e = client->Exists({Key(8), Key(9), Key(10)}, kModel);
  EXPECT_EQ(e.present, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(e.retention_floor_s, (std::vector<uint32_t>{300, 900, 0}));
}

TEST_F(KvClientTest, DownNodeIsAMissThenSkippedThenProbedUntilItIsBack) {
  StartNodes(3);
  ClientOptions options = Options();
  options.deadline = absl::Milliseconds(500);
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  Objects o(0, 30);
  ASSERT_EQ(client->Put(o.objects), 30);
  std::vector<bool> on_node2(30);
  int node2_keys = 0;
  for (int i = 0; i < 30; ++i) {
    on_node2[i] = client->NodesFor(o.keys[i])[0] == 2;
    node2_keys += on_node2[i];
  }
  ASSERT_GT(node2_keys, 0);

  auto expect_node2_misses = [&](const std::vector<ClientGetResult>& got) {
    for (int i = 0; i < 30; ++i) {
      EXPECT_EQ(got[i].found, !on_node2[i]) << i;
      if (got[i].found) {
        EXPECT_EQ(got[i].value, o.values[i]);
      }
    }
  };

  nodes_[2]->Stop();
  absl::Time start = absl::Now();
  expect_node2_misses(client->Get(o.keys, kModel));
  const absl::Duration first = absl::Now() - start;
  EXPECT_LT(first, options.deadline + absl::Milliseconds(500));
  NodeStatus s = client->nodes()[2];
  EXPECT_FALSE(s.up);
  EXPECT_EQ(s.failures, 1);
  EXPECT_EQ(s.down_until, clock_.Now() + absl::Milliseconds(100));
  const int64_t requests = s.requests;

  // Skipped without an RPC by every call while the backoff lasts.
  start = absl::Now();
  expect_node2_misses(client->Get(o.keys, kModel));
  const absl::Duration skipped = absl::Now() - start;
  const ExistsResult e = client->Exists(o.keys, kModel);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(e.present[i], !on_node2[i]) << i;
  Objects extra(200, 260);
  int extra_on_node2 = 0;
  for (const Hash128& key : extra.keys) extra_on_node2 += client->NodesFor(key)[0] == 2;
  EXPECT_EQ(client->Put(extra.objects), 60 - extra_on_node2);
  std::vector<Hash128> node2_only;
  for (int i = 0; i < 30; ++i) {
    if (on_node2[i]) node2_only.push_back(o.keys[i]);
  }
  start = absl::Now();
  for (const ClientGetResult& r : client->Get(node2_only, kModel)) EXPECT_FALSE(r.found);
  const absl::Duration skipped_only = absl::Now() - start;
  EXPECT_EQ(client->nodes()[2].requests, requests);
  EXPECT_LT(skipped, absl::Milliseconds(250));
  EXPECT_LT(skipped_only, absl::Milliseconds(50));

  // After the backoff one call probes it; it fails again, and the backoff doubles up to its cap.
  for (absl::Duration backoff :
       {absl::Milliseconds(200), absl::Milliseconds(400), absl::Milliseconds(400)}) {
    clock_.Advance(client->nodes()[2].down_until - clock_.Now());
    expect_node2_misses(client->Get(o.keys, kModel));
    s = client->nodes()[2];
    EXPECT_FALSE(s.up);
    EXPECT_EQ(s.down_until, clock_.Now() + backoff);
  }
  EXPECT_EQ(client->nodes()[2].requests, requests + 3);
  EXPECT_EQ(client->nodes()[2].failures, 4);

  // Back on the same port with the same directory: skipped until the backoff ends, then used.
  RestartNode(2);
  expect_node2_misses(client->Get(o.keys, kModel));
  clock_.Advance(absl::Milliseconds(400));
  start = absl::Now();
  const auto back = client->Get(o.keys, kModel);
  const absl::Duration probe = absl::Now() - start;
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(back[i].found) << i;
    EXPECT_EQ(back[i].value, o.values[i]);
  }
  s = client->nodes()[2];
  EXPECT_TRUE(s.up);
  EXPECT_EQ(client->Exists(o.keys, kModel).prefix, 30);
  std::cerr << "node down: first Get " << first << ", skipping Get " << skipped
            << " (of its keys only: " << skipped_only << "), Get probing the restarted node "
            << probe << "\n";
}

TEST_F(KvClientTest, SlowNodeIsAMissNotAnError) {
  StartNodes(3);
  ClientOptions options = Options(/*replication=*/2);
  options.deadline = absl::Milliseconds(300);
  auto replicated = NewClient(options);
  options.replication = 1;
  auto single = NewClient(options);
  ASSERT_NE(replicated, nullptr);
  ASSERT_NE(single, nullptr);
  Objects o(0, 30);
  ASSERT_EQ(replicated->Put(o.objects), 30);

  nodes_[1]->set_delay(absl::Seconds(30));
  absl::Time start = absl::Now();
  const auto got = single->Get(o.keys, kModel);
  const absl::Duration single_time = absl::Now() - start;
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(got[i].found, single->NodesFor(o.keys[i])[0] != 1) << i;
  }
  // gRPC's timers may fire up to a millisecond or so before absl::Now() reads the deadline as
  // passed (measured once: 299.4 ms for 300).
  EXPECT_GE(single_time, options.deadline - absl::Milliseconds(5));
  EXPECT_LT(single_time, options.deadline + absl::Seconds(1));
  EXPECT_FALSE(single->nodes()[1].up);

  // With a replica the slow node costs one deadline, then its keys come from the next node.
  start = absl::Now();
  const auto replica = replicated->Get(o.keys, kModel);
  const absl::Duration replicated_time = absl::Now() - start;
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(replica[i].found) << i;
    EXPECT_EQ(replica[i].value, o.values[i]);
  }
  EXPECT_LT(replicated_time, options.deadline + absl::Seconds(1));
  EXPECT_FALSE(replicated->nodes()[1].up);

  // Fast again: after the backoff the probe succeeds. (Under a sanitizer on a loaded machine one
  // call can still miss its 300 ms deadline; the node then stays down for another backoff, so
  // this waits out a few backoffs, on the fake clock, for the recovery it must make.)
  nodes_[1]->set_delay(absl::ZeroDuration());
  clock_.Advance(absl::Milliseconds(100));
  bool all_found = false;
  for (int attempt = 0; attempt < 5 && !all_found; ++attempt) {
    if (attempt > 0) clock_.Advance(absl::Seconds(60));
    const auto back = single->Get(o.keys, kModel);
    all_found =
        std::all_of(back.begin(), back.end(), [](const ClientGetResult& r) { return r.found; });
  }
  EXPECT_TRUE(all_found);
  EXPECT_TRUE(single->nodes()[1].up);
  std::cerr << "slow node (deadline " << options.deadline << "): replication 1 Get " << single_time
            << ", replication 2 Get " << replicated_time << "\n";
}

TEST_F(KvClientTest, AllNodesSlowGiveMissesNotErrors) {
  StartNodes(3);
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  // 60 keys: every call involves every node (all but certainly).
  Objects o(3, 63);
  ASSERT_EQ(client->Put(o.objects), 60);
  ClientOptions options = Options();
  options.deadline = absl::Milliseconds(100);
  auto hasty = NewClient(options);
  ASSERT_NE(hasty, nullptr);
  for (auto& node : nodes_) node->set_delay(absl::Seconds(30));

  // Every kind of call: nothing, within about one deadline (the nodes are asked in parallel).
  const absl::Time start = absl::Now();
  for (const ClientGetResult& r : hasty->Get(o.keys, kModel)) EXPECT_FALSE(r.found);
  const absl::Duration get_time = absl::Now() - start;
  EXPECT_LT(get_time, options.deadline + absl::Seconds(1));
  clock_.Advance(absl::Milliseconds(100));
  const ExistsResult e = hasty->Exists(o.keys, kModel);
  EXPECT_EQ(e.prefix, 0);
  EXPECT_EQ(e.present, std::vector<bool>(60, false));
  clock_.Advance(absl::Milliseconds(200));
  EXPECT_EQ(hasty->Put(Objects(100, 160).objects), 0);
  clock_.Advance(absl::Milliseconds(400));
  EXPECT_EQ(hasty->Delete(Objects(100, 160).keys), 0);
  for (const NodeStatus& s : hasty->nodes()) {
    EXPECT_FALSE(s.up) << s.address;
    EXPECT_EQ(s.failures, 4) << s.address;
  }

  // The nodes themselves are fine.
  for (auto& node : nodes_) node->set_delay(absl::ZeroDuration());
  for (const ClientGetResult& r : client->Get(o.keys, kModel)) EXPECT_TRUE(r.found);
  // A deadline that has passed before the call starts: misses (or, where gRPC still completes
  // the call, the right bytes), never anything else.
  options.deadline = absl::Microseconds(1);
  auto expired = NewClient(options);
  ASSERT_NE(expired, nullptr);
  const auto got = expired->Get(o.keys, kModel);
  for (int i = 0; i < 60; ++i) {
    if (got[i].found) {
      EXPECT_EQ(got[i].value, o.values[i]);
    }
  }
  std::cerr << "all nodes slow (deadline 100ms): Get " << get_time << "\n";
}

TEST_F(KvClientTest, RefusedObjectIsNotANodeFailure) {
  StartNodes(3);
  ClientOptions options = Options();
  options.deadline = absl::Seconds(10);
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  Objects o(10, 20);
  const std::string huge = Value(99, size_t{9} << 20);  // over the nodes' 8 MiB limit
  const Hash128 huge_key = Key(99);
  o.objects.push_back({huge_key, Meta(99), huge});
  EXPECT_EQ(client->Put(o.objects), 10);
  EXPECT_FALSE(client->Get({huge_key}, kModel)[0].found);
  for (const ClientGetResult& r : client->Get(o.keys, kModel)) EXPECT_TRUE(r.found);
  for (const NodeStatus& s : client->nodes()) {
    EXPECT_TRUE(s.up) << s.address;
    EXPECT_EQ(s.failures, 0) << s.address;
  }
}

TEST_F(KvClientTest, ConcurrentCallers) {
  StartNodes(3);
  auto client = NewClient(Options(/*replication=*/2));
  ASSERT_NE(client, nullptr);
  std::vector<std::thread> threads;
  std::vector<int> hits(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        const int from = 1000 + t * 100 + round * 5;
        Objects o(from, from + 5, 4096);
        EXPECT_EQ(client->Put(o.objects), 5);
        const auto got = client->Get(o.keys, kModel);
        for (int i = 0; i < 5; ++i) {
          if (got[i].found && got[i].value == o.values[i]) ++hits[t];
        }
        EXPECT_EQ(client->Exists(o.keys, kModel).prefix, 5);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(hits[t], 50) << "thread " << t;
}

// One buffer holding a span per size, filled with 0xEE.
struct Spans {
  std::vector<char> memory;
  std::vector<absl::Span<char>> spans;

  explicit Spans(const std::vector<size_t>& sizes) {
    size_t total = 0;
    for (size_t n : sizes) total += n;
    memory.assign(total, '\xEE');
    size_t at = 0;
    for (size_t n : sizes) {
      spans.push_back(absl::Span<char>(memory.data() + at, n));
      at += n;
    }
  }

  std::string operator[](size_t i) const { return std::string(spans[i].data(), spans[i].size()); }
};

std::vector<size_t> SizesOf(const std::vector<std::string>& values) {
  std::vector<size_t> sizes;
  for (const std::string& v : values) sizes.push_back(v.size());
  return sizes;
}

TEST_F(KvClientTest, GetIntoLandsValuesBitExactInTheSpans) {
  StartNodes(3);
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  Objects o(0, 30);  // 0 B, 100 B, 3 MiB (three chunks), then 100 B each
  ASSERT_EQ(client->Put(o.objects), 30);
  std::vector<Hash128> keys = o.keys;
  keys.push_back(Key(1000));  // absent
  std::vector<size_t> sizes = SizesOf(o.values);
  sizes.push_back(100);
  sizes[5] = 99;   // one byte short of its value
  sizes[6] = 101;  // one byte over
  Spans into(sizes);
  const std::vector<GetIntoResult> got = client->GetInto(keys, kModel, {into.spans, std::nullopt});
  ASSERT_EQ(got.size(), 31u);
  for (int i = 0; i < 30; ++i) {
    if (i == 5 || i == 6) {
      EXPECT_FALSE(got[i].found) << i << ": a span of the wrong size is a miss";
      continue;
    }
    ASSERT_TRUE(got[i].found) << i;
    EXPECT_TRUE(into[i] == o.values[i]) << i << " is not bit-exact in its span";
    ExpectSameMeta(got[i].meta, Meta(i));
  }
  EXPECT_FALSE(got[30].found);

  // 64 KiB chunks: the 3 MiB value arrives in 48 pieces, each copied into place.
  ClientOptions small = Options();
  small.max_chunk_bytes = 64 << 10;
  auto small_client = NewClient(small);
  ASSERT_NE(small_client, nullptr);
  Spans big({o.values[2].size(), o.values[1].size()});
  const auto big_got = small_client->GetInto({o.keys[2], o.keys[1]}, kModel, {big.spans, {}});
  ASSERT_TRUE(big_got[0].found);
  ASSERT_TRUE(big_got[1].found);
  EXPECT_TRUE(big[0] == o.values[2]);
  EXPECT_TRUE(big[1] == o.values[1]);
  // Another model's fingerprint: misses.
  for (const GetIntoResult& r : client->GetInto({o.keys[1]}, kOtherModel, {{big.spans[1]}, {}})) {
    EXPECT_FALSE(r.found);
  }

  // A bad destination: every key a miss, no RPC.
  const int64_t requests =
      client->nodes()[0].requests + client->nodes()[1].requests + client->nodes()[2].requests;
  for (const GetIntoResult& r :
       client->GetInto({o.keys[1], o.keys[3]}, kModel, {{big.spans[1]}, {}})) {
    EXPECT_FALSE(r.found);
  }
  GetIntoDestination wrong_slices{{big.spans[1]}, transfer::PeerDescriptor()};
  wrong_slices.descriptor->kind = "grpc";
  wrong_slices.descriptor->address = "127.0.0.1:1";
  for (const GetIntoResult& r : client->GetInto({o.keys[1]}, kModel, wrong_slices)) {
    EXPECT_FALSE(r.found);
  }
  EXPECT_EQ(client->nodes()[0].requests + client->nodes()[1].requests + client->nodes()[2].requests,
            requests);
  EXPECT_TRUE(client->GetInto({}, kModel, {}).empty());
  for (const NodeStatus& s : client->nodes()) EXPECT_EQ(s.failures, 0) << s.address;
}

// A node that answers Get from a map, sending some values with a flipped byte (the header's
// checksum is the true value's) and one under the header of another key.
class FakeNode final : public ferry::v1::KvStore::Service {
 public:
  void Add(const Hash128& key, std::string value, bool corrupt = false,
           const Hash128* named = nullptr) {
    objects_[key] = {std::move(value), corrupt, named != nullptr ? *named : key};
  }

  grpc::Status Get(grpc::ServerContext*, const ferry::v1::GetRequest* request,
                   grpc::ServerWriter<ferry::v1::GetChunk>* writer) override {
    for (int i = 0; i < request->block_hashes_size(); ++i) {
      ferry::v1::GetChunk chunk;
      chunk.set_index(static_cast<uint32_t>(i));
      auto it = objects_.find(HashFromProto(request->block_hashes(i)));
      if (it != objects_.end()) {
        const Object& o = it->second;
        chunk.set_found(true);
        ferry::v1::ObjectHeader* h = chunk.mutable_header();
        HashToProto(o.named, h->mutable_block_hash());
        HashToProto(kModel, h->mutable_model_fingerprint());
        h->set_size_bytes(o.value.size());
        h->set_checksum(Checksum(o.value));
        std::string data = o.value;
        if (o.corrupt) data[data.size() / 2] ^= 0x01;
        chunk.set_data(data);
      }
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }

 private:
  struct Object {
    std::string value;
    bool corrupt;
    Hash128 named;
  };
  std::map<Hash128, Object> objects_;
};

TEST_F(KvClientTest, GetIntoCorruptOrForeignValueIsAMiss) {
  FakeNode fake;
  const std::string good = Value(1, 5000), bad = Value(2, 5000), foreign = Value(3, 5000);
  fake.Add(Key(1), good);
  fake.Add(Key(2), bad, /*corrupt=*/true);
  const Hash128 other = Key(99);
  fake.Add(Key(3), foreign, false, &other);
  auto server = GrpcServer::Start(GrpcServerOptions(), {&fake});
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.nodes = {(*server)->address()};
  options.clock = &clock_;
  auto client = NewClient(options);
  ASSERT_NE(client, nullptr);
  Spans into({5000, 5000, 5000});
  const auto got = client->GetInto({Key(1), Key(2), Key(3)}, kModel, {into.spans, {}});
  EXPECT_TRUE(got[0].found);
  EXPECT_TRUE(into[0] == good);
  EXPECT_FALSE(got[1].found) << "a value whose checksum fails is a miss";
  EXPECT_FALSE(got[2].found) << "a value under another key's header is a miss";
  // Get says the same.
  const auto same = client->Get({Key(1), Key(2), Key(3)}, kModel);
  EXPECT_TRUE(same[0].found);
  EXPECT_FALSE(same[1].found);
  EXPECT_FALSE(same[2].found);
  EXPECT_TRUE(client->nodes()[0].up);
}

TEST_F(KvClientTest, GetIntoFindsAKeyOnItsSecondReplica) {
  StartNodes(3);
  auto client = NewClient(Options(/*replication=*/2));
  ASSERT_NE(client, nullptr);
  Objects o(1, 21);
  ASSERT_EQ(client->Put(o.objects), 20);
  // The first five are gone from their first replica: a miss there, found on the second.
  for (int i = 0; i < 5; ++i) {
    const int first = client->NodesFor(o.keys[i])[0];
    ASSERT_TRUE(nodes_[first]->store().Delete({o.keys[i]}).ok());
    ASSERT_FALSE(NodeHas(first, o.keys[i]));
    ASSERT_TRUE(NodeHas(client->NodesFor(o.keys[i])[1], o.keys[i]));
  }
  Spans into(SizesOf(o.values));
  const auto got = client->GetInto(o.keys, kModel, {into.spans, {}});
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(got[i].found) << i;
    EXPECT_TRUE(into[i] == o.values[i]) << i;
    ExpectSameMeta(got[i].meta, Meta(i + 1));
  }
  for (const NodeStatus& s : client->nodes()) EXPECT_TRUE(s.up) << s.address;
}

TEST_F(KvClientTest, GetIntoNodeDownIsAMiss) {
  StartNodes(3);
  auto client = NewClient(Options());
  ASSERT_NE(client, nullptr);
  Objects o(0, 30);
  ASSERT_EQ(client->Put(o.objects), 30);
  nodes_[2]->Stop();
  Spans into(SizesOf(o.values));
  const auto got = client->GetInto(o.keys, kModel, {into.spans, {}});
  int misses = 0;
  for (int i = 0; i < 30; ++i) {
    const bool on_down_node = client->NodesFor(o.keys[i])[0] == 2;
    EXPECT_EQ(got[i].found, !on_down_node) << i;
    if (got[i].found) {
      EXPECT_TRUE(into[i] == o.values[i]) << i;
    }
    misses += on_down_node;
  }
  EXPECT_GT(misses, 0);
  EXPECT_FALSE(client->nodes()[2].up);
}

// Nodes with gRPC KV transports and a caller with its own: GetInto with a descriptor is served by
// the nodes' puts. A node that fails mid-call (here: stopped) may have puts in flight into its
// keys' spans, so those keys are misses in that call rather than read from the next replica; the
// next call skips the down node and finds them there.
TEST_F(KvClientTest, GetIntoWithADescriptorDoesNotRetryAFailedNodesKeys) {
  std::vector<std::unique_ptr<transfer::KvTransport>> transports;
  std::vector<transfer::KvTransport*> raw;
  for (int i = 0; i < 4; ++i) {
    auto t = transfer::KvTransport::Create({.kind = "grpc"});
    ASSERT_TRUE(t.ok()) << t.status();
    raw.push_back(t->get());
    transports.push_back(*std::move(t));
  }
  transfer::KvTransport& caller = *transports[3];
  StartNodes(3, raw.data());
  auto client = NewClient(Options(/*replication=*/2));
  ASSERT_NE(client, nullptr);
  Objects o(3, 33, 4096);
  ASSERT_EQ(client->Put(o.objects), 30);
  auto region = caller.Allocate(30 * 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  char* base = static_cast<char*>(region->span.address);
  GetIntoDestination destination;
  destination.descriptor = transfer::PeerDescriptor();
  destination.descriptor->kind = "grpc";
  destination.descriptor->address = caller.address();
  destination.descriptor->regions = {region->descriptor};
  for (size_t i = 0; i < 30; ++i) {
    destination.spans.push_back(absl::Span<char>(base + i * 4096, 4096));
    destination.descriptor->block_slices.push_back({0, i * 4096, 4096});
  }
  auto got = client->GetInto(o.keys, kModel, destination);
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(got[i].found) << i;
    EXPECT_TRUE(std::string(base + i * 4096, 4096) == o.values[i]) << i;
    EXPECT_TRUE(got[i].by_transport) << i;
    EXPECT_FALSE(got[i].unsettled) << i;
  }

  nodes_[0]->Stop();
  std::memset(base, 0, 30 * 4096);
  got = client->GetInto(o.keys, kModel, destination);
  int first_on_stopped = 0;
  for (int i = 0; i < 30; ++i) {
    const bool first_stopped = client->NodesFor(o.keys[i])[0] == 0;
    first_on_stopped += first_stopped;
    EXPECT_EQ(got[i].found, !first_stopped) << i;
    // Its puts may still reach the spans until the deadline plus the cancel grace.
    EXPECT_EQ(got[i].unsettled, first_stopped) << i;
  }
  EXPECT_GT(first_on_stopped, 0);
  EXPECT_FALSE(client->nodes()[0].up);
  // Skipped while down: its keys come from their second replica.
  got = client->GetInto(o.keys, kModel, destination);
  for (int i = 0; i < 30; ++i) {
    ASSERT_TRUE(got[i].found) << i;
    EXPECT_TRUE(std::string(base + i * 4096, 4096) == o.values[i]) << i;
  }
  nodes_.clear();  // before the transports they use
  EXPECT_TRUE(caller.Deregister(region->id).ok());
}

// Nodes without a KV transport refuse a descriptor (FAILED_PRECONDITION): the values come in the
// stream, in the same call and, without asking again, in the next ones.
TEST_F(KvClientTest, GetIntoFromNodesWithoutATransportReadsTheStream) {
  auto caller = transfer::KvTransport::Create({.kind = "grpc"});
  ASSERT_TRUE(caller.ok()) << caller.status();
  StartNodes(2);
  auto client = NewClient(Options(/*replication=*/1));
  ASSERT_NE(client, nullptr);
  Objects o(3, 11, 4096);
  ASSERT_EQ(client->Put(o.objects), 8);
  auto region = (*caller)->Allocate(8 * 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  char* base = static_cast<char*>(region->span.address);
  GetIntoDestination destination;
  destination.descriptor = transfer::PeerDescriptor();
  destination.descriptor->kind = "grpc";
  destination.descriptor->address = (*caller)->address();
  destination.descriptor->regions = {region->descriptor};
  for (size_t i = 0; i < 8; ++i) {
    destination.spans.push_back(absl::Span<char>(base + i * 4096, 4096));
    destination.descriptor->block_slices.push_back({0, i * 4096, 4096});
  }
  for (int call = 0; call < 2; ++call) {
    std::memset(base, 0, 8 * 4096);
    auto got = client->GetInto(o.keys, kModel, destination);
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(got[i].found) << call << " " << i;
      EXPECT_FALSE(got[i].by_transport) << call << " " << i;
      EXPECT_FALSE(got[i].unsettled) << call << " " << i;
      EXPECT_TRUE(std::string(base + i * 4096, 4096) == o.values[i]) << call << " " << i;
    }
  }
  for (const NodeStatus& node : client->nodes()) EXPECT_TRUE(node.up) << node.address;
  EXPECT_TRUE((*caller)->Deregister(region->id).ok());
}

// A node set that changes (DNS discovery): no node is all misses; a node added or removed moves
// only its own keys, so the keys of the nodes that stay are found where they were.
TEST_F(KvClientTest, DynamicClientFollowsItsNodeSet) {
  StartNodes(3);
  ClientOptions options = Options(/*replication=*/2);
  const std::vector<std::string> all = options.nodes;
  options.nodes.clear();
  auto client = DynamicKvClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  Objects objects(10, 60);
  EXPECT_EQ((*client)->Put(objects.objects), 0);
  EXPECT_FALSE((*client)->Get(objects.keys, kModel)[0].found);
  EXPECT_EQ((*client)->Exists(objects.keys, kModel).prefix, 0);
  EXPECT_TRUE((*client)->nodes().empty());

  // One node: replication is at most the nodes there are.
  ASSERT_TRUE((*client)->SetNodes({all[0]}).ok());
  EXPECT_EQ((*client)->Put(objects.objects), 50);
  // Three nodes: a key stays readable if node 0 is among its two replicas, as placement says.
  ASSERT_TRUE((*client)->SetNodes(all).ok());
  EXPECT_EQ((*client)->nodes().size(), 3u);
  std::vector<ClientGetResult> got = (*client)->Get(objects.keys, kModel);
  int on_node0 = 0;
  for (size_t i = 0; i < objects.keys.size(); ++i) {
    const std::vector<int> order = (*client)->NodesFor(objects.keys[i]);
    const bool placed = order[0] == 0 || order[1] == 0;
    on_node0 += placed;
    EXPECT_EQ(got[i].found, placed) << i;
    if (got[i].found) EXPECT_EQ(got[i].value, objects.values[i]);
  }
  EXPECT_GT(on_node0, 0);
  EXPECT_LT(on_node0, 50);
  // Written again over three nodes, then node 2 leaves: every key had a replica on 0 or 1.
  EXPECT_EQ((*client)->Put(objects.objects), 50);
  ASSERT_TRUE((*client)->SetNodes({all[0], all[1]}).ok());
  got = (*client)->Get(objects.keys, kModel);
  for (size_t i = 0; i < objects.keys.size(); ++i) EXPECT_TRUE(got[i].found) << i;
  EXPECT_FALSE((*client)->SetNodes({all[0], all[0]}).ok());
  EXPECT_EQ((*client)->node_names(), (std::vector<std::string>{all[0], all[1]}));
  ClientOptions bad;
  bad.replication = 0;
  EXPECT_FALSE(DynamicKvClient::Create(bad).ok());
}

}  // namespace
}  // namespace kv
}  // namespace ferry
