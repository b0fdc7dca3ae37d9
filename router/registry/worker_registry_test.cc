// The registry against fake workers (in-process gRPC servers whose Watch streams the test
// drives): workers come up on their first message, a mismatched fingerprint or block size is
// refused (also against a pinned fingerprint), a refused worker is asked again, a broken stream or
// a stopped heartbeat (FakeClock) takes a worker down and a new stream brings it back, draining
// workers are no candidates, and capacity bounds candidates; KV events reach the index, a broken
// stream resumes after the index's sequence, and a gap makes the registry resubscribe and resync;
// workers added at runtime come up, removed ones stop being candidates at once (no transition),
// their stream and KV blocks go, and they can be added again.

#include "router/registry/worker_registry.h"

#include <algorithm>
#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/fake_clock.h"
#include "gtest/gtest.h"
#include "services/common/grpc_server.h"

namespace ferry {
namespace {

// A worker whose Watch streams send what the test pushes.
class FakeWorker final : public v1::Worker::CallbackService {
 public:
  class Stream final : public grpc::ServerWriteReactor<v1::WorkerStatus> {
   public:
    explicit Stream(FakeWorker* owner) : owner_(owner) {}
    void Send(const v1::WorkerStatus& status) {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      pending_.push_back(status);
      if (!writing_) WriteNext();
    }
    void Break() {
      std::lock_guard<std::mutex> lock(mu_);
      if (!done_) {
        done_ = true;
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "broken by the test"));
      }
    }
    void OnWriteDone(bool ok) override {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      pending_.pop_front();
      if (ok && !pending_.empty() && !done_) WriteNext();
    }
    void OnCancel() override { Break(); }
    void OnDone() override {
      owner_->Gone(this);
      delete this;
    }

   private:
    void WriteNext() {
      writing_ = true;
      StartWrite(&pending_.front());
    }
    FakeWorker* const owner_;
    std::mutex mu_;
    std::deque<v1::WorkerStatus> pending_;
    bool writing_ = false, done_ = false;
  };

  grpc::ServerWriteReactor<v1::WorkerStatus>* Watch(grpc::CallbackServerContext*,
                                                    const v1::WatchRequest* request) override {
    auto* s = new Stream(this);
    std::lock_guard<std::mutex> lock(mu_);
    streams_.push_back(s);
    ++subscriptions_;
    requests_.push_back(*request);
    return s;
  }
  v1::WatchRequest last_request() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_.back();
  }
  void Gone(Stream* s) {
    std::lock_guard<std::mutex> lock(mu_);
    streams_.erase(std::remove(streams_.begin(), streams_.end(), s), streams_.end());
  }
  // Sends to every open stream.
  void Send(const v1::WorkerStatus& status) {
    std::lock_guard<std::mutex> lock(mu_);
    for (Stream* s : streams_) s->Send(status);
  }
  void BreakAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (Stream* s : streams_) s->Break();
  }
  int subscriptions() {
    std::lock_guard<std::mutex> lock(mu_);
    return subscriptions_;
  }
  int open_streams() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(streams_.size());
  }

 private:
  std::mutex mu_;
  std::vector<Stream*> streams_;
  int subscriptions_ = 0;
  std::vector<v1::WatchRequest> requests_;
};

v1::WorkerStatus Status(const std::string& id, uint64_t fingerprint, uint32_t block_tokens,
                        bool snapshot = true) {
  v1::WorkerStatus s;
  s.set_snapshot(snapshot);
  s.set_worker_id(id);
  s.set_role(v1::WORKER_ROLE_AGGREGATED);
  s.mutable_model()->set_name("tiny");
  s.mutable_model()->mutable_fingerprint()->set_lo(fingerprint);
  s.set_protocol_version(v1::PROTOCOL_VERSION_1);
  s.set_drain_state(v1::DRAIN_STATE_SERVING);
  s.mutable_capacity()->set_block_tokens(block_tokens);
  s.mutable_capacity()->set_max_running_requests(2);
  s.mutable_capacity()->set_max_queued_requests(1);
  s.mutable_capacity()->set_max_context_tokens(256);
  s.mutable_capacity()->set_max_choices(4);
  return s;
}

// Polls `done` for up to 10 s (the registry reacts on its own threads).
template <typename Fn>
bool Eventually(Fn done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

struct Fleet {
  explicit Fleet(int n) {
    for (int i = 0; i < n; ++i) {
      workers.push_back(std::make_unique<FakeWorker>());
      servers.push_back(*GrpcServer::Start({}, {workers.back().get()}));
      addresses.push_back(servers.back()->address());
    }
  }
  // Whether every worker has the registry's status stream open (a status sent before its stream
  // is open reaches nobody).
  bool AllStreaming() const {
    for (const auto& w : workers) {
      if (w->open_streams() != 1) return false;
    }
    return true;
  }
  std::vector<std::unique_ptr<FakeWorker>> workers;
  std::vector<std::unique_ptr<GrpcServer>> servers;
  std::vector<std::string> addresses;
};

// A message of KV events: `stored` and `evicted` block hashes (Hash128{i, i}), at `sequence`.
v1::WorkerStatus Events(v1::WorkerStatus status, uint64_t incarnation, uint64_t sequence,
                        std::vector<uint64_t> stored, std::vector<uint64_t> evicted = {}) {
  status.set_incarnation(incarnation);
  status.set_sequence(sequence);
  for (auto [type, ids] : {std::make_pair(v1::KV_EVENT_TYPE_STORED, stored),
                           std::make_pair(v1::KV_EVENT_TYPE_EVICTED, evicted)}) {
    if (ids.empty()) continue;
    v1::KvEvent* e = status.add_kv_events();
    e->set_type(type);
    for (uint64_t i : ids) {
      e->add_block_hashes()->set_lo(i);
      e->mutable_block_hashes()->rbegin()->set_hi(i << 60 | i);
    }
  }
  return status;
}

TEST(WorkerRegistryTest, KvEventsResumeAfterABreakAndResyncAfterAGap) {
  Fleet fleet(1);
  FakeClock clock;
  RegistryOptions options;
  options.reconnect_interval = absl::Milliseconds(100);
  KvIndex index;
  options.index = &index;
  WorkerRegistry registry(fleet.addresses, options, &clock);
  registry.Start();
  FakeWorker& w = *fleet.workers[0];
  auto held = [&] {
    std::vector<uint64_t> out;
    for (uint64_t i = 1; i < 10; ++i) {
      if (index.Holds(0, Hash128{i, i << 60 | i})) out.push_back(i);
    }
    return out;
  };
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  EXPECT_EQ(w.last_request().after_sequence(), 0u);  // nothing yet: a snapshot, please
  w.Send(Events(Status("w0", 7, 16), 5, 2, {1, 2}));
  w.Send(Events(Status("w0", 7, 16, false), 5, 3, {3}));
  ASSERT_TRUE(Eventually([&] { return held() == std::vector<uint64_t>{1, 2, 3}; }));
  EXPECT_EQ(registry.ToJson()[0]["kv_index"]["sequence"], 3);

  // A broken stream resumes after sequence 3 of incarnation 5; its first message continues.
  w.BreakAll();
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 0; }));
  clock.Advance(absl::Milliseconds(150));
  ASSERT_TRUE(Eventually([&] { return w.subscriptions() == 2 && w.open_streams() == 1; }));
  EXPECT_EQ(w.last_request().after_sequence(), 3u);
  EXPECT_EQ(w.last_request().incarnation(), 5u);
  w.Send(Events(Status("w0", 7, 16, false), 5, 4, {}, {1}));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));
  ASSERT_TRUE(Eventually([&] { return held() == std::vector<uint64_t>{2, 3}; }));

  // A gap (sequence 4 -> 9 with one event): nothing of it applied, the stream ends, and the new
  // one asks for what follows 4; the worker answers with a snapshot, which the index becomes.
  w.Send(Events(Status("w0", 7, 16, false), 5, 9, {7}));
  // (No backoff: the clock does not move.)
  ASSERT_TRUE(Eventually([&] { return w.subscriptions() == 3 && w.open_streams() == 1; }));
  EXPECT_EQ(held(), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(w.last_request().after_sequence(), 4u);
  w.Send(Events(Status("w0", 7, 16), 5, 12, {3, 8, 9}));
  ASSERT_TRUE(Eventually([&] { return held() == std::vector<uint64_t>{3, 8, 9}; }));
  EXPECT_EQ(index.blocks(0), 3);
  const nlohmann::json json = registry.ToJson()[0]["kv_index"];
  EXPECT_EQ(json["gaps"], 1);
  EXPECT_EQ(json["snapshots"], 2);
  EXPECT_EQ(json["blocks"], 3);
  registry.Stop();
}

TEST(WorkerRegistryTest, WorkersComeUpAndAMismatchedOneIsRefused) {
  Fleet fleet(3);
  FakeClock clock;
  RegistryOptions options;
  WorkerRegistry registry(fleet.addresses, options, &clock);
  std::vector<std::string> refusals;
  std::mutex mu;
  registry.SetOnRefusal([&](const std::string& r) {
    std::lock_guard<std::mutex> lock(mu);
    refusals.push_back(r);
  });
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  EXPECT_FALSE(registry.AnyUp());
  fleet.workers[0]->Send(Status("w0", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));
  EXPECT_EQ(registry.pool().fingerprint, (Hash128{7, 0}));
  EXPECT_EQ(registry.pool().block_tokens, 16u);
  fleet.workers[1]->Send(Status("w1", 8, 16));  // another model
  fleet.workers[2]->Send(Status("w2", 7, 32));  // another block size
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return refusals.size() == 2;
  }));
  EXPECT_EQ(registry.up_count(), 1);
  std::vector<Candidate> candidates = registry.Candidates();
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].id, "w0");
  const nlohmann::json json = registry.ToJson();
  ASSERT_EQ(json.size(), 3u);
  EXPECT_EQ(json[1]["state"], "refused");
  EXPECT_NE(json[1]["reason"].get<std::string>().find("fingerprint"), std::string::npos);
  EXPECT_NE(json[2]["reason"].get<std::string>().find("block_tokens"), std::string::npos);
  registry.Stop();
}

TEST(WorkerRegistryTest, APinnedFingerprintRefusesEvenTheFirstAndARefusedWorkerIsAskedAgain) {
  Fleet fleet(2);
  FakeClock clock;
  RegistryOptions options;
  options.fingerprint = Hash128{7, 0};
  WorkerRegistry registry(fleet.addresses, options, &clock);
  std::vector<std::string> refusals;
  std::mutex mu;
  registry.SetOnRefusal([&](const std::string& r) {
    std::lock_guard<std::mutex> lock(mu);
    refusals.push_back(r);
  });
  auto refused = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return refusals.size();
  };
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  fleet.workers[0]->Send(Status("w0", 8, 16));  // first, but not the pinned model
  ASSERT_TRUE(Eventually([&] { return refused() == 1; }));
  EXPECT_FALSE(registry.pool().known);
  fleet.workers[1]->Send(Status("w1", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));
  EXPECT_EQ(registry.pool().fingerprint, (Hash128{7, 0}));

  // After the reconnect interval the refused worker is asked again; it stays "refused" meanwhile,
  // and the same refusal is not counted twice.
  ASSERT_TRUE(Eventually([&] { return !registry.ToJson()[0]["streaming"].get<bool>(); }));
  clock.Advance(options.reconnect_interval);
  ASSERT_TRUE(Eventually([&] { return fleet.workers[0]->subscriptions() == 2; }));
  EXPECT_EQ(registry.ToJson()[0]["state"], "refused");
  ASSERT_TRUE(Eventually([&] { return fleet.workers[0]->open_streams() == 1; }));
  fleet.workers[0]->Send(Status("w0", 8, 16));
  ASSERT_TRUE(Eventually([&] { return !registry.ToJson()[0]["streaming"].get<bool>(); }));
  EXPECT_EQ(registry.ToJson()[0]["state"], "refused");
  // No sleep to show that nothing more is reported: refusals are reported in the order they were
  // made, so a third try refused for another reason (its block size) is a marker that reaches the
  // callback only after anything the second try queued. A new reason counts again.
  clock.Advance(options.reconnect_interval);
  ASSERT_TRUE(Eventually([&] {  // the new stream, and only it (the last one's server side is gone)
    return fleet.workers[0]->subscriptions() == 3 && fleet.workers[0]->open_streams() == 1;
  }));
  fleet.workers[0]->Send(Status("w0", 7, 32));
  ASSERT_TRUE(Eventually([&] { return refused() == 2; }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(refusals, (std::vector<std::string>{"fingerprint", "block_tokens"}));
  }
  ASSERT_TRUE(Eventually([&] { return !registry.ToJson()[0]["streaming"].get<bool>(); }));
  EXPECT_EQ(registry.ToJson()[0]["state"], "refused");

  // Restarted on the right model: accepted on the next try, one fixed interval later (a known
  // address gets no growing backoff: a restarted worker is seen within the interval).
  clock.Advance(options.reconnect_interval);
  ASSERT_TRUE(Eventually([&] {
    return fleet.workers[0]->subscriptions() == 4 && fleet.workers[0]->open_streams() == 1;
  }));
  fleet.workers[0]->Send(Status("w0", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 2; }));
  EXPECT_EQ(registry.ToJson()[0]["state"], "up");
  EXPECT_EQ(refused(), 2u);
  registry.Stop();
}

TEST(WorkerRegistryTest, ABrokenStreamOrAStoppedHeartbeatTakesAWorkerDownUntilItComesBack) {
  Fleet fleet(2);
  FakeClock clock;
  RegistryOptions options;
  options.heartbeat_timeout = absl::Seconds(3);
  options.reconnect_interval = absl::Milliseconds(100);
  WorkerRegistry registry(fleet.addresses, options, &clock);
  // Every up/down transition is reported once, in order (the dispatcher migrates on them).
  std::mutex mu;
  std::vector<std::string> transitions;
  registry.SetOnWorkerState([&](const std::string& id, bool up) {
    std::lock_guard<std::mutex> lock(mu);
    transitions.push_back(id + (up ? " up" : " down"));
  });
  auto reported = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return transitions;
  };
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  fleet.workers[0]->Send(Status("w0", 7, 16));
  fleet.workers[1]->Send(Status("w1", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 2; }));
  ASSERT_TRUE(Eventually([&] { return reported().size() == 2; }));
  fleet.workers[0]->Send(Status("w0", 7, 16));  // a message while up: no transition

  // A broken stream: down at once; after the backoff a new stream, and up on its snapshot.
  fleet.workers[0]->BreakAll();
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));
  EXPECT_EQ(registry.Candidates().size(), 1u);
  EXPECT_EQ(fleet.workers[0]->subscriptions(), 1);
  clock.Advance(absl::Milliseconds(150));
  ASSERT_TRUE(Eventually([&] { return fleet.workers[0]->subscriptions() == 2; }));
  fleet.workers[0]->Send(Status("w0", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 2; }));

  // A worker that stops sending (w1) while the other keeps its heartbeat: down after 3 s.
  clock.Advance(absl::Seconds(2));
  fleet.workers[0]->Send(Status("w0", 7, 16, false));
  ASSERT_TRUE(
      Eventually([&] { return registry.ToJson()[0]["last_message_ms_ago"].get<int64_t>() == 0; }));
  clock.Advance(absl::Seconds(2));  // w1 silent for 4 s, w0 for 2 s
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));
  std::vector<Candidate> left = registry.Candidates();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].id, "w0");
  EXPECT_NE(registry.ToJson()[1]["reason"].get<std::string>().find("no message"),
            std::string::npos);
  // It is asked again (a new stream) after the backoff, and is back on its first message. The
  // backoff counts from when the cancelled stream is done, so the clock moves after that.
  ASSERT_TRUE(Eventually([&] { return !registry.ToJson()[1]["streaming"].get<bool>(); }));
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(Eventually([&] { return fleet.workers[1]->subscriptions() >= 2; }));
  fleet.workers[1]->Send(Status("w1", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 2; }));
  ASSERT_TRUE(Eventually([&] { return reported().size() == 6; }));
  std::vector<std::string> got = reported();
  std::sort(got.begin(), got.begin() + 2);  // the first two in either order
  EXPECT_EQ(got,
            (std::vector<std::string>{"w0 up", "w1 up", "w0 down", "w0 up", "w1 down", "w1 up"}));
  registry.Stop();
}

TEST(WorkerRegistryTest, DrainingWorkersAndFullOnesAreNoCandidates) {
  Fleet fleet(2);
  FakeClock clock;
  WorkerRegistry registry(fleet.addresses, RegistryOptions(), &clock);
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  fleet.workers[0]->Send(Status("w0", 7, 16));
  fleet.workers[1]->Send(Status("w1", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.Candidates().size() == 2; }));
  v1::WorkerStatus draining = Status("w1", 7, 16, false);
  draining.set_drain_state(v1::DRAIN_STATE_DRAINING);
  fleet.workers[1]->Send(draining);
  ASSERT_TRUE(Eventually([&] { return registry.Candidates().size() == 1; }));
  EXPECT_TRUE(registry.AnyUp());
  // Capacity: 2 running + 1 queued; the router's own count of requests in flight decides.
  registry.AddLoad("w0", 3);
  EXPECT_TRUE(registry.Candidates().empty());
  registry.AddLoad("w0", -1);
  ASSERT_EQ(registry.Candidates().size(), 1u);
  EXPECT_EQ(registry.Candidates()[0].load.inflight, 2);
  registry.Stop();
}

TEST(WorkerRegistryTest, AnUnreachableWorkerIsDownAndAWorkerFileIsRead) {
  FakeClock clock;
  WorkerRegistry registry({"127.0.0.1:1"}, RegistryOptions(), &clock);
  registry.Start();
  ASSERT_TRUE(Eventually([&] {
    return registry.ToJson()[0]["state"] == "down" &&
           registry.ToJson()[0]["reason"].get<std::string>().find("failed") != std::string::npos;
  }));
  EXPECT_FALSE(registry.AnyUp());
  registry.Stop();
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/workers");
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("# workers\n127.0.0.1:7500\n\n 127.0.0.1:7501  # second\n", f);
  std::fclose(f);
  auto listed = WorkerRegistry::ReadWorkerFile(path);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(*listed, (std::vector<std::string>{"127.0.0.1:7500", "127.0.0.1:7501"}));
}

TEST(WorkerRegistryTest, AWorkerAddedAtRuntimeBecomesACandidate) {
  Fleet fleet(2);
  FakeClock clock;
  // One address given twice is one worker.
  WorkerRegistry registry({fleet.addresses[0], fleet.addresses[0]}, RegistryOptions(), &clock);
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return fleet.workers[0]->open_streams() == 1; }));
  EXPECT_EQ(registry.ToJson().size(), 1u);
  fleet.workers[0]->Send(Status("w0", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));

  ASSERT_TRUE(registry.SetWorkers({fleet.addresses[0], fleet.addresses[1]}).ok());
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  EXPECT_EQ(fleet.workers[0]->subscriptions(), 1);  // the listed one keeps its stream
  EXPECT_EQ(registry.up_count(), 1);
  v1::WorkerStatus decode = Status("w1", 7, 16);
  decode.set_role(v1::WORKER_ROLE_DECODE);
  decode.mutable_load()->set_busy_fraction(0.25f);
  decode.mutable_load()->set_running_requests(1);
  fleet.workers[1]->Send(decode);
  ASSERT_TRUE(Eventually([&] { return registry.Candidates().size() == 2; }));
  EXPECT_EQ(registry.up_count(), 2);
  const nlohmann::json json = registry.ToJson();
  ASSERT_EQ(json.size(), 2u);
  EXPECT_EQ(json[1]["id"], "w1");
  EXPECT_EQ(json[1]["state"], "up");
  // What a planner sizes the pools by: the role, the capacity and the load window's busy share.
  EXPECT_EQ(json[0]["role"], "aggregated");
  EXPECT_EQ(json[1]["role"], "decode");
  EXPECT_EQ(json[1]["max_running_requests"], 2);
  EXPECT_EQ(json[1]["load"]["running_requests"], 1);
  EXPECT_DOUBLE_EQ(json[1]["load"]["busy_fraction"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(json[0]["load"]["busy_fraction"].get<double>(), 0.0);
  registry.Stop();
  EXPECT_EQ(registry.SetWorkers({fleet.addresses[0]}).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(WorkerRegistryTest, ARemovedWorkerStopsAtOnceLosesItsStreamAndBlocksAndCanComeBack) {
  Fleet fleet(2);
  FakeClock clock;
  KvIndex index;
  RegistryOptions options;
  options.index = &index;
  WorkerRegistry registry(fleet.addresses, options, &clock);
  std::mutex mu;
  std::vector<std::string> transitions;
  registry.SetOnWorkerState([&](const std::string& id, bool up) {
    std::lock_guard<std::mutex> lock(mu);
    transitions.push_back(id + (up ? " up" : " down"));
  });
  auto reported = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return transitions;
  };
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  fleet.workers[0]->Send(Events(Status("w0", 7, 16), 1, 1, {1}));
  fleet.workers[1]->Send(Events(Status("w1", 7, 16), 1, 2, {2, 3}));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 2 && index.entries() == 3; }));
  ASSERT_TRUE(Eventually([&] { return reported().size() == 2; }));
  registry.AddLoad("w1", 1);  // a request streaming from w1 (the dispatcher's)

  // Removed: no candidate and not up from the call's return on; its stream is cancelled.
  ASSERT_TRUE(registry.SetWorkers({fleet.addresses[0]}).ok());
  std::vector<Candidate> candidates = registry.Candidates();
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].id, "w0");
  EXPECT_EQ(registry.up_count(), 1);
  EXPECT_TRUE(registry.AnyUp());
  ASSERT_TRUE(Eventually([&] { return fleet.workers[1]->open_streams() == 0; }));
  // Until its stream has ended, /workers shows it only as "removed"; its entry and its blocks go
  // once the stream's end reaches the registry's thread (waited for: the worker's side of the
  // stream closes first, so the server's count says nothing about the registry's).
  for (const nlohmann::json& j : registry.ToJson()) {
    if (j["id"] != "w0") EXPECT_EQ(j["state"], "removed") << j.dump();
  }
  ASSERT_TRUE(Eventually([&] { return registry.ToJson().size() == 1u; }));
  EXPECT_EQ(registry.ToJson()[0]["id"], "w0");
  ASSERT_TRUE(Eventually([&] { return index.entries() == 1; }));
  EXPECT_FALSE(registry.Drain("w1", 1).ok());
  registry.AddLoad("w1", -1);  // that request ends: nothing to count it against
  // Messages it still sends reach nobody; no down transition was reported (its requests go on).
  fleet.workers[1]->Send(Status("w1", 7, 16, false));
  EXPECT_EQ(fleet.workers[1]->open_streams(), 0);
  // No sleep to show that nothing is reported: SetWorkers reports the transitions queued so far
  // itself before it returns (after any report under way on another thread), so once this call
  // with the same list returns, a down transition for w1 would be in `reported`.
  ASSERT_TRUE(registry.SetWorkers({fleet.addresses[0]}).ok());
  EXPECT_EQ(registry.up_count(), 1);
  EXPECT_EQ(reported().size(), 2u);

  // Added again: a new stream, which asks for a snapshot, and a candidate on its first message.
  ASSERT_TRUE(registry.SetWorkers({fleet.addresses[0], fleet.addresses[1]}).ok());
  ASSERT_TRUE(Eventually([&] { return fleet.workers[1]->open_streams() == 1; }));
  EXPECT_EQ(fleet.workers[1]->subscriptions(), 2);
  EXPECT_EQ(fleet.workers[1]->last_request().after_sequence(), 0u);
  fleet.workers[1]->Send(Events(Status("w1", 7, 16), 1, 3, {2, 3, 4}));
  ASSERT_TRUE(Eventually([&] { return registry.Candidates().size() == 2; }));
  ASSERT_TRUE(Eventually([&] { return index.entries() == 4; }));
  EXPECT_EQ(registry.Candidates()[1].load.inflight, 0);
  ASSERT_TRUE(Eventually([&] { return reported().size() == 3; }));
  EXPECT_EQ(reported()[2], "w1 up");

  // Removing every worker: nothing can be served, and the pool's facts are forgotten.
  ASSERT_TRUE(registry.SetWorkers({}).ok());
  EXPECT_FALSE(registry.AnyUp());
  EXPECT_EQ(registry.up_count(), 0);
  EXPECT_FALSE(registry.pool().known);
  ASSERT_TRUE(Eventually([&] { return registry.ToJson().empty() && index.entries() == 0; }));
  EXPECT_EQ(reported().size(), 3u);
  registry.Stop();
}

TEST(WorkerRegistryTest, AWorkerWithoutAStreamIsRemovedAtOnceAndABadAddressChangesNothing) {
  Fleet fleet(1);
  FakeClock clock;
  WorkerRegistry registry({"127.0.0.1:1", fleet.addresses[0]}, RegistryOptions(), &clock);
  registry.Start();
  ASSERT_TRUE(Eventually([&] { return !registry.ToJson()[0]["streaming"].get<bool>(); }));
  EXPECT_EQ(registry.SetWorkers({fleet.addresses[0], "no-port"}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.ToJson().size(), 2u);
  ASSERT_TRUE(registry.SetWorkers({fleet.addresses[0]}).ok());
  EXPECT_EQ(registry.ToJson().size(), 1u);  // it had no stream to wait for
  ASSERT_TRUE(Eventually([&] { return fleet.AllStreaming(); }));
  fleet.workers[0]->Send(Status("w0", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));
  // Removed and added again at once, while its old stream may still be ending: the new entry
  // comes up on a stream of its own, and the old one goes.
  ASSERT_TRUE(registry.SetWorkers({}).ok());
  ASSERT_TRUE(registry.SetWorkers({fleet.addresses[0]}).ok());
  ASSERT_TRUE(Eventually([&] { return registry.ToJson().size() == 1; }));
  ASSERT_TRUE(Eventually([&] {
    return fleet.workers[0]->subscriptions() == 2 && fleet.workers[0]->open_streams() == 1;
  }));
  fleet.workers[0]->Send(Status("w0", 7, 16));
  ASSERT_TRUE(Eventually([&] { return registry.up_count() == 1; }));
  registry.Stop();
}

}  // namespace
}  // namespace ferry
