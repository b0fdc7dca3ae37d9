// Three ferry-kvstore processes on loopback behind one KvClient (replication 1). While a reader
// and a writer keep calling the client, one node is killed with SIGKILL: no call fails or hangs,
// that node's keys become misses and every other key still hits; the node restarts on the same
// port and directory and its keys hit again (its acknowledged objects were durable). Then a node
// gets SIGTERM while puts stream to it: it exits 0, and every put it acknowledged is there after
// its restart.

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"
#include "kvstore/client/kv_client.h"
#include "tests/integration/service_process.h"

namespace ferry {
namespace kv {
namespace {

namespace fs = std::filesystem;
std::string g_server;

const Hash128 kModel = Xxh3Hash128("multinode model");

Hash128 Key(int i) { return Xxh3Hash128("multinode " + std::to_string(i)); }

std::string Value(int i) {
  std::string v(1024 + (i * 7919) % 60000, '\0');
  std::mt19937 rng(i);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

// The test's step counter: the client calls its threads completed. Each Step() releases the
// mutex, and absl::Mutex re-evaluates what a test awaits then, so a wait follows the calls that
// change the client's state (no poll interval, no sleep).
class Steps {
 public:
  void Step() {
    absl::MutexLock lock(&mu_);
    ++steps_;
  }
  // Waits until `done()` holds (evaluated after each step, under the counter's mutex: it must
  // not call the client, only read its state) or `timeout` passes; whether it held.
  template <typename Fn>
  bool Await(Fn done, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }

 private:
  absl::Mutex mu_;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
};

// Calls `attempt` (a client call: each is its own step) until it returns true or `timeout`
// passes; whether it did.
template <typename Fn>
bool RetryCalls(Fn attempt, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!attempt()) {
    if (absl::Now() > deadline) return false;
  }
  return true;
}

// A ferry-kvstore child on `dir`, on `port` (0: any).
class Node {
 public:
  Node(const std::string& dir, int port)
      : process_(g_server, {"--dir=" + dir, absl::StrCat("--address=127.0.0.1:", port),
                            "--segment_bytes=4MiB", "--capacity=256MiB", "--max_object_bytes=1MiB",
                            "--rpc_grace_ms=5000"}) {}
  bool ready() const { return process_.ready(); }
  int port() const { return process_.grpc_port(); }
  void Kill() {
    process_.Signal(SIGKILL);
    process_.WaitForExit(absl::Seconds(30));
  }
  // SIGTERM, then the exit status (-1: still running after 30 s, 128 + signal when one ended it).
  int Terminate() {
    process_.Signal(SIGTERM);
    return process_.WaitForExit(absl::Seconds(30));
  }

 private:
  ServiceProcess process_;
};

class MultiNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / "multinode";
    fs::remove_all(root_);
    for (int n = 0; n < 3; ++n) {
      nodes_.push_back(std::make_unique<Node>((root_ / std::to_string(n)).string(), 0));
      ASSERT_TRUE(nodes_.back()->ready()) << "node " << n << " did not start";
      addresses_.push_back(absl::StrCat("127.0.0.1:", nodes_.back()->port()));
    }
    ClientOptions o;
    o.nodes = addresses_;
    o.deadline = absl::Milliseconds(500);
    o.down_backoff = absl::Milliseconds(100);
    o.max_down_backoff = absl::Milliseconds(400);
    // The backoffs run on a fake clock: a down node is probed again when the test moves it.
    o.clock = &clock_;
    client_ = *KvClient::Create(o);
  }
  void Restart(int n) {
    nodes_[n] = std::make_unique<Node>((root_ / std::to_string(n)).string(),
                                       std::stoi(addresses_[n].substr(10)));
    ASSERT_TRUE(nodes_[n]->ready()) << "node " << n << " did not restart";
  }
  // Gets keys [0, n): found[i] per key, each found value checked byte for byte.
  std::vector<bool> GetAll(int n) {
    std::vector<Hash128> keys;
    for (int i = 0; i < n; ++i) keys.push_back(Key(i));
    const auto got = client_->Get(keys, kModel);
    std::vector<bool> found(n);
    for (int i = 0; i < n; ++i) {
      found[i] = got[i].found;
      if (got[i].found) {
        EXPECT_EQ(got[i].value, Value(i)) << "object " << i;
      }
    }
    return found;
  }
  int Owner(int i) { return client_->NodesFor(Key(i))[0]; }
  // Past any node's backoff: its next request probes it.
  void PastTheBackoff() { clock_.Advance(absl::Milliseconds(400)); }

  FakeClock clock_;
  fs::path root_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::string> addresses_;
  std::unique_ptr<KvClient> client_;
};

TEST_F(MultiNodeTest, ANodeKilledAndRestartedCostsMissesNeverErrors) {
  constexpr int kObjects = 300;
  std::vector<std::string> values;
  std::vector<ClientObject> objects;
  for (int i = 0; i < kObjects; ++i) values.push_back(Value(i));
  for (int i = 0; i < kObjects; ++i) {
    ClientObject o;
    o.key = Key(i);
    o.meta.fingerprint = kModel;
    o.meta.token_count = 64;
    o.value = values[i];
    objects.push_back(o);
  }
  ASSERT_EQ(client_->Put(objects), kObjects);
  for (bool f : GetAll(kObjects)) ASSERT_TRUE(f);
  int owned = 0;
  for (int i = 0; i < kObjects; ++i) owned += Owner(i) == 1;
  ASSERT_GT(owned, 50);

  // A reader and a writer keep going while node 1 dies; every call returns, none takes long.
  std::atomic<bool> stop{false};
  std::atomic<int64_t> calls{0}, slow{0}, reads{0}, writes{0};
  Steps steps;
  auto timed = [&](auto fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    if (std::chrono::steady_clock::now() - start > std::chrono::milliseconds(1500)) ++slow;
    ++calls;
  };
  std::thread reader([&] {
    while (!stop) {
      timed([&] { GetAll(kObjects); });
      ++reads;
      steps.Step();
    }
  });
  std::thread writer([&] {
    for (int i = kObjects; !stop; ++i) {
      const std::string v = Value(i);
      ClientObject o{Key(i), {}, v};
      o.meta.fingerprint = kModel;
      timed([&] { client_->Put({o}); });
      ++writes;
      steps.Step();
    }
  });
  // Both are going.
  ASSERT_TRUE(steps.Await([&] { return reads > 0 && writes > 0; }, absl::Seconds(30)));
  nodes_[1]->Kill();
  // The client finds node 1 down on its own calls; each time the clock passes its backoff, one
  // call probes it and fails again (and returns: none is slow).
  ASSERT_TRUE(steps.Await([&] { return !client_->nodes()[1].up; }, absl::Seconds(30)));
  for (int probe = 0; probe < 3; ++probe) {
    const int64_t failures = client_->nodes()[1].failures;
    PastTheBackoff();
    ASSERT_TRUE(
        steps.Await([&] { return client_->nodes()[1].failures > failures; }, absl::Seconds(30)));
  }
  // Down: node 1's keys are misses, all others hit.
  const std::vector<bool> down = GetAll(kObjects);
  for (int i = 0; i < kObjects; ++i) EXPECT_EQ(down[i], Owner(i) != 1) << "object " << i;
  EXPECT_FALSE(client_->nodes()[1].up);

  Restart(1);
  // Past its backoff the next call probes it, and it is back. (Called again until every key
  // hits: the reader's call may be the probe, and a call that skips the node meanwhile reads its
  // keys as misses.)
  PastTheBackoff();
  std::vector<bool> back;
  RetryCalls(
      [&] {
        back = GetAll(kObjects);
        return std::all_of(back.begin(), back.end(), [](bool b) { return b; });
      },
      absl::Seconds(5));
  stop = true;
  reader.join();
  writer.join();
  for (int i = 0; i < kObjects; ++i) EXPECT_TRUE(back[i]) << "object " << i << " after restart";
  EXPECT_TRUE(client_->nodes()[1].up);
  EXPECT_GT(calls, 10);
  EXPECT_EQ(slow, 0) << "calls that took over 1.5 s";
}

TEST_F(MultiNodeTest, SigtermLosesNothingAcknowledged) {
  // Single-object puts; those that returned 1 were acknowledged by their node.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::set<int> acked;
  Steps steps;
  std::thread writer([&] {
    for (int i = 0; !stop; ++i) {
      const std::string v = Value(i);
      ClientObject o{Key(i), {}, v};
      o.meta.fingerprint = kModel;
      if (client_->Put({o}) == 1) {
        std::lock_guard<std::mutex> lock(mu);
        acked.insert(i);
      }
      steps.Step();
    }
  });
  // Enough acknowledged puts, node 2's among them, for the checks below.
  auto acked_on = [&](int node) {
    std::lock_guard<std::mutex> lock(mu);
    return std::count_if(acked.begin(), acked.end(), [&](int i) { return Owner(i) == node; });
  };
  ASSERT_TRUE(steps.Await(
      [&] {
        std::lock_guard<std::mutex> lock(mu);
        return acked.size() > 20;
      },
      absl::Seconds(30)));
  ASSERT_TRUE(steps.Await([&] { return acked_on(2) > 5; }, absl::Seconds(30)));
  EXPECT_EQ(nodes_[2]->Terminate(), 0) << "ferry-kvstore did not exit cleanly on SIGTERM";
  // The writer goes on until its puts to node 2 have found it gone.
  ASSERT_TRUE(steps.Await([&] { return !client_->nodes()[2].up; }, absl::Seconds(30)));
  stop = true;
  writer.join();
  Restart(2);
  PastTheBackoff();  // the next call probes node 2
  std::vector<Hash128> keys;
  std::vector<int> ids;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (int i : acked) {
      keys.push_back(Key(i));
      ids.push_back(i);
    }
  }
  ASSERT_GT(ids.size(), 20u);
  // Nothing else calls the client now: this Get probes node 2 and finds it back. (Called again,
  // with the clock past the backoff each time, should the restarted node refuse a first call.)
  std::vector<ClientGetResult> got;
  RetryCalls(
      [&] {
        got = client_->Get(keys, kModel);
        if (std::all_of(got.begin(), got.end(), [](const auto& g) { return g.found; })) return true;
        PastTheBackoff();
        return false;
      },
      absl::Seconds(4));
  int on_node_2 = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    on_node_2 += Owner(ids[k]) == 2;
    ASSERT_TRUE(got[k].found) << "acknowledged object " << ids[k] << " (node " << Owner(ids[k])
                              << ") lost";
    EXPECT_EQ(got[k].value, Value(ids[k]));
  }
  EXPECT_GT(on_node_2, 5);
}

}  // namespace
}  // namespace kv
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) ferry::kv::g_server = argv[1];
  return RUN_ALL_TESTS();
}
