// In-process tests of the KvTransport contract (kv_transport.h): two transports of one kind in
// this process, talking over 127.0.0.1. The suite runs for every implementation; one whose
// factory still answers Unimplemented is skipped. Also: request validation, the KvAllocator
// adapter, descriptor <-> proto, and the notification board both implementations share.

#include "services/transfer/kv_transport.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/backends/cpu/cpu_backend.h"
#include "engine/kv/kv_block_pool.h"
#include "ferry/v1/transfer.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/transfer/notification_board.h"
#include "services/transfer/transfer_metrics.h"
#include "services/transfer/transfer_wire.h"

namespace ferry {
namespace transfer {
namespace {

// Added to every deadline a test waits for: CI machines are slow (2 cores, sanitizers).
constexpr absl::Duration kSlack = absl::Seconds(2);
// A transfer that should succeed gets this long.
constexpr absl::Duration kTransferTimeout = absl::Seconds(20);
// Small enough that a block spans several messages and ends mid-message.
constexpr size_t kChunkBytes = 16 << 10;

// A callback's outcome, for a test thread to wait on. Shared with the callback, so a test that
// fails early leaves nothing dangling.
class Outcome {
 public:
  static std::shared_ptr<Outcome> New() { return std::make_shared<Outcome>(); }

  static DoneCallback CallbackOf(const std::shared_ptr<Outcome>& outcome) {
    return [outcome](absl::Status status) {
      absl::MutexLock lock(&outcome->mu_);
      ++outcome->calls_;
      outcome->status_ = std::move(status);
      outcome->thread_ = std::this_thread::get_id();
    };
  }

  // The status, or nullopt if the callback has not run within `timeout`.
  std::optional<absl::Status> Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto called = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&called), timeout)) return std::nullopt;
    return status_;
  }

  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::thread::id thread() const {
    absl::MutexLock lock(&mu_);
    return thread_;
  }

 private:
  mutable absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread::id thread_ ABSL_GUARDED_BY(mu_);
};

// Waits (with a bound) until `condition` holds.
bool Eventually(const std::function<bool()>& condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

void FillRandom(void* address, size_t bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* p = static_cast<unsigned char*>(address);
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(rng());
}

bool IsZero(const void* address, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(address);
  for (size_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }
char* Ptr(const LocalRegion& region) { return static_cast<char*>(region.span.address); }

// The value of a metric with these labels in the registry; nullopt if absent.
std::optional<double> MetricValue(prometheus::Registry& registry, const std::string& name,
                                  const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      std::map<std::string, std::string> have;
      for (const prometheus::ClientMetric::Label& l : metric.label) have[l.name] = l.value;
      if (have != labels) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter:
          return metric.counter.value;
        case prometheus::MetricType::Gauge:
          return metric.gauge.value;
        case prometheus::MetricType::Histogram:
          return static_cast<double>(metric.histogram.sample_count);
        default:
          return std::nullopt;
      }
    }
  }
  return std::nullopt;
}

struct TransportParam {
  std::string kind;
  std::string ucx_tls;
};

std::string ParamName(const testing::TestParamInfo<TransportParam>& info) {
  return info.param.ucx_tls.empty() ? info.param.kind
                                    : absl::StrCat(info.param.kind, "_", info.param.ucx_tls);
}

// Two transports: `a_` initiates, `b_` owns the remote memory; `peer_` is b_ as seen from a_.
class KvTransportTest : public testing::TestWithParam<TransportParam> {
 protected:
  TransportOptions Options(prometheus::Registry* registry) const {
    TransportOptions options;
    options.kind = GetParam().kind;
    options.ucx_tls = GetParam().ucx_tls;
    options.grpc_chunk_bytes = kChunkBytes;
    options.registry = registry;
    return options;
  }

  void SetUp() override {
    absl::StatusOr<std::unique_ptr<KvTransport>> a = KvTransport::Create(Options(&registry_a_));
    if (a.status().code() == absl::StatusCode::kUnimplemented) {
      // Under CI a transport that was not built is a broken install, not a skip.
      const char* ci = std::getenv("CI");
      ASSERT_FALSE(ci != nullptr && std::string(ci) == "true")
          << GetParam().kind << " transport not built under CI=true: " << a.status();
      GTEST_SKIP() << GetParam().kind << " transport not built: " << a.status();
    }
    ASSERT_TRUE(a.ok()) << a.status();
    absl::StatusOr<std::unique_ptr<KvTransport>> b = KvTransport::Create(Options(&registry_b_));
    ASSERT_TRUE(b.ok()) << b.status();
    a_ = *std::move(a);
    b_ = *std::move(b);
    EXPECT_EQ(a_->kind(), GetParam().kind);
    a_regions_ = a_->registered_regions();
    b_regions_ = b_->registered_regions();
    absl::StatusOr<PeerId> peer = a_->Connect(b_->address());
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
  }

  void TearDown() override {
    // Every test gives back what it registered.
    if (a_ != nullptr) {
      EXPECT_EQ(a_->registered_regions(), a_regions_);
    }
    if (b_ != nullptr) {
      EXPECT_EQ(b_->registered_regions(), b_regions_);
    }
  }

  bool IsGrpc() const { return GetParam().kind == "grpc"; }

  // peer_ again: the same connection, or a new one where a transport had to force the old one
  // closed to get its memory back (a cancel or deadline with operations in flight) and so marked
  // the peer failed.
  bool Reconnect() {
    absl::StatusOr<PeerId> peer = a_->Connect(b_->address());
    EXPECT_TRUE(peer.ok()) << peer.status();
    if (!peer.ok()) return false;
    peer_ = *peer;
    return true;
  }

  // The owner's Deregister after a transfer that failed or was cancelled at the initiator: a
  // transport may refuse it (FailedPrecondition) while the peer's last operations drain.
  static bool DeregisterEventually(KvTransport& transport, RegionId id) {
    absl::Status status;
    const bool done = Eventually(
        [&] {
          status = transport.Deregister(id);
          return status.code() != absl::StatusCode::kFailedPrecondition;
        },
        absl::Seconds(5));
    EXPECT_TRUE(done && status.ok()) << status;
    return done && status.ok();
  }

  static LocalRegion MustAllocate(KvTransport& transport, size_t bytes) {
    absl::StatusOr<LocalRegion> region = transport.Allocate(bytes);
    EXPECT_TRUE(region.ok()) << region.status();
    return region.ok() ? *region : LocalRegion{};
  }

  TransferRequest Request(TransferOp op, const LocalRegion& remote,
                          std::vector<TransferSegment> segments,
                          absl::Duration timeout = kTransferTimeout) const {
    TransferRequest request;
    request.peer = peer_;
    request.op = op;
    request.remote = remote.descriptor;
    request.segments = std::move(segments);
    request.deadline = absl::Now() + timeout;
    return request;
  }

  // Posts and waits for the callback (which must run within the deadline and slack).
  absl::Status PostAndWait(TransferRequest request) {
    const absl::Duration bound = request.deadline - absl::Now() + kSlack;
    auto outcome = Outcome::New();
    absl::StatusOr<TransferId> id = a_->Post(std::move(request), Outcome::CallbackOf(outcome));
    if (!id.ok()) return id.status();
    std::optional<absl::Status> status = outcome->Wait(bound);
    if (!status.has_value()) return absl::InternalError("the callback did not run in time");
    return *status;
  }

  // A scatter list of `n` blocks: local block 2 * perm[i] + 1 <-> remote block 2 * i (no two
  // blocks adjacent on either side, the local order shuffled).
  static std::vector<TransferSegment> Scatter(const LocalRegion& local, const LocalRegion& remote,
                                              int n, size_t block_bytes) {
    std::vector<int> perm(n);
    for (int i = 0; i < n; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
    std::vector<TransferSegment> segments;
    for (int i = 0; i < n; ++i) {
      segments.push_back({Addr(Ptr(local) + (2 * perm[i] + 1) * block_bytes),
                          Addr(Ptr(remote) + 2 * i * block_bytes), block_bytes});
    }
    return segments;
  }

  prometheus::Registry registry_a_;
  prometheus::Registry registry_b_;
  std::unique_ptr<KvTransport> a_;
  std::unique_ptr<KvTransport> b_;
  PeerId peer_ = 0;
  int64_t a_regions_ = 0;
  int64_t b_regions_ = 0;
};

constexpr int kBlocks = 64;
// Not a multiple of the chunk: blocks end mid-message.
constexpr size_t kBlockBytes = 3 * kChunkBytes + 1234;
constexpr size_t kScatterRegionBytes = 2 * kBlocks * kBlockBytes;

TEST_P(KvTransportTest, PutOfAScatterListIsBitExact) {
  LocalRegion src = MustAllocate(*a_, kScatterRegionBytes);
  LocalRegion dst = MustAllocate(*b_, kScatterRegionBytes);
  FillRandom(Ptr(src), kScatterRegionBytes, 1);
  std::vector<TransferSegment> segments = Scatter(src, dst, kBlocks, kBlockBytes);

  ASSERT_EQ(PostAndWait(Request(TransferOp::kPut, dst, segments)), absl::OkStatus());
  for (const TransferSegment& s : segments) {
    EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(s.remote_address),
                          reinterpret_cast<const void*>(s.local_address), s.length),
              0);
  }
  // The blocks between them are untouched.
  for (int i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(IsZero(Ptr(dst) + (2 * i + 1) * kBlockBytes, kBlockBytes)) << "block " << i;
  }
  EXPECT_EQ(a_->Deregister(src.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(dst.id), absl::OkStatus());
}

TEST_P(KvTransportTest, GetOfAScatterListIsBitExact) {
  LocalRegion dst = MustAllocate(*a_, kScatterRegionBytes);
  LocalRegion src = MustAllocate(*b_, kScatterRegionBytes);
  FillRandom(Ptr(src), kScatterRegionBytes, 2);
  std::vector<TransferSegment> segments = Scatter(dst, src, kBlocks, kBlockBytes);

  ASSERT_EQ(PostAndWait(Request(TransferOp::kGet, src, segments)), absl::OkStatus());
  for (const TransferSegment& s : segments) {
    EXPECT_EQ(std::memcmp(reinterpret_cast<const void*>(s.local_address),
                          reinterpret_cast<const void*>(s.remote_address), s.length),
              0);
  }
  for (int i = 0; i < kBlocks; ++i) {
    EXPECT_TRUE(IsZero(Ptr(dst) + 2 * i * kBlockBytes, kBlockBytes)) << "block " << i;
  }
  EXPECT_EQ(a_->Deregister(dst.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(src.id), absl::OkStatus());
}

TEST_P(KvTransportTest, CallerMemoryCanBeRegistered) {
  std::vector<char> local(1 << 20);
  std::vector<char> remote(1 << 20);
  FillRandom(local.data(), local.size(), 3);
  absl::StatusOr<LocalRegion> l = a_->Register({local.data(), local.size()});
  absl::StatusOr<LocalRegion> r = b_->Register({remote.data(), remote.size()});
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(a_->registered_regions(), a_regions_ + 1);
  // Registrations may not overlap.
  EXPECT_EQ(a_->Register({local.data() + 100, 10}).status().code(),
            absl::StatusCode::kAlreadyExists);

  ASSERT_EQ(PostAndWait(Request(TransferOp::kPut, *r,
                                {{Addr(local.data()), Addr(remote.data()), local.size()}})),
            absl::OkStatus());
  EXPECT_EQ(local, remote);
  EXPECT_EQ(a_->Deregister(l->id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(r->id), absl::OkStatus());
  EXPECT_EQ(a_->Deregister(l->id).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(a_->Deregister(987654).code(), absl::StatusCode::kNotFound);
}

TEST_P(KvTransportTest, ManyConcurrentTransfers) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 8;
  constexpr size_t kBytes = 100000;
  constexpr size_t kTotal = kThreads * kPerThread * kBytes;
  LocalRegion local = MustAllocate(*a_, kTotal);
  LocalRegion remote = MustAllocate(*b_, kTotal);
  // Slot i is put from local (even i) or got from remote (odd i): both end up equal.
  for (size_t i = 0; i < kThreads * kPerThread; ++i) {
    FillRandom((i % 2 == 0 ? Ptr(local) : Ptr(remote)) + i * kBytes, kBytes, 100 + i);
  }
  std::vector<absl::Status> results(kThreads * kPerThread);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t * kPerThread; i < (t + 1) * kPerThread; ++i) {
        const size_t offset = i * kBytes;
        results[i] =
            PostAndWait(Request(i % 2 == 0 ? TransferOp::kPut : TransferOp::kGet, remote,
                                {{Addr(Ptr(local) + offset), Addr(Ptr(remote) + offset), kBytes}}));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(Ptr(local), Ptr(remote), kTotal), 0);
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(remote.id), absl::OkStatus());
}

TEST_P(KvTransportTest, NotificationsReachTheOwner) {
  LocalRegion local = MustAllocate(*a_, 1 << 20);
  LocalRegion remote = MustAllocate(*b_, 1 << 20);
  FillRandom(Ptr(local), 1 << 20, 5);
  for (TransferOp op : {TransferOp::kPut, TransferOp::kGet}) {
    SCOPED_TRACE(TransferOpName(op));
    const std::string id = absl::StrCat("req-", TransferOpName(op));
    // Awaited first.
    auto awaited = Outcome::New();
    b_->AwaitNotification(id, absl::Now() + kTransferTimeout, Outcome::CallbackOf(awaited));
    TransferRequest request =
        Request(op, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), size_t{1} << 20}});
    request.transfer_id = id;
    ASSERT_EQ(PostAndWait(std::move(request)), absl::OkStatus());
    std::optional<absl::Status> status = awaited->Wait(kTransferTimeout);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(status->ok()) << *status;

    // The outcome arrives before the await: kept, and delivered at once.
    request = Request(op, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), size_t{1} << 20}});
    request.transfer_id = id + "-early";
    ASSERT_EQ(PostAndWait(std::move(request)), absl::OkStatus());
    const absl::Time start = absl::Now();
    EXPECT_EQ(b_->WaitNotification(id + "-early", absl::Now() + absl::Seconds(10)),
              absl::OkStatus());
    EXPECT_LT(absl::Now() - start, kSlack);
  }
  EXPECT_EQ(std::memcmp(Ptr(local), Ptr(remote), 1 << 20), 0);
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(remote.id), absl::OkStatus());
}

TEST_P(KvTransportTest, AwaitEndsAtItsDeadline) {
  const absl::Duration timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  const absl::Status status = b_->WaitNotification("nobody-sends-this", start + timeout);
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_GE(elapsed, timeout - absl::Milliseconds(5));
  EXPECT_LT(elapsed, timeout + kSlack);
  // A second await on an id still awaited is refused.
  auto first = Outcome::New();
  b_->AwaitNotification("twice", absl::Now() + absl::Seconds(30), Outcome::CallbackOf(first));
  EXPECT_EQ(b_->WaitNotification("twice", absl::Now() + absl::Seconds(30)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(first->calls(), 0);
}

TEST_P(KvTransportTest, TransferToADestroyedPeerFailsWithinItsDeadline) {
  LocalRegion local = MustAllocate(*a_, 1 << 20);
  LocalRegion remote = MustAllocate(*b_, 1 << 20);
  const RegionDescriptor descriptor = remote.descriptor;
  const std::string address = b_->address();
  ASSERT_EQ(b_->Deregister(remote.id), absl::OkStatus());
  b_.reset();

  const absl::Duration timeout = absl::Seconds(3);
  TransferRequest request =
      Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), descriptor.address, 4096}}, timeout);
  const absl::Time start = absl::Now();
  const absl::Status status = PostAndWait(std::move(request));
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.code(), absl::StatusCode::kInternal) << status;  // the callback ran in time
  EXPECT_LT(absl::Now() - start, timeout + kSlack);
  if (status.code() == absl::StatusCode::kUnavailable) {
    // The peer is marked failed.
    EXPECT_EQ(
        a_->Post(Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), descriptor.address, 4096}}),
                 [](absl::Status) { ADD_FAILURE() << "callback of a refused Post"; })
            .status()
            .code(),
        absl::StatusCode::kUnavailable);
  }
  // Connecting again makes a new connection, or fails: nothing listens there.
  absl::StatusOr<PeerId> again = a_->Connect(address);
  if (IsGrpc()) {
    EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  }
  if (again.ok()) {
    EXPECT_NE(*again, peer_);
  }
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
}

// A put large enough to be in flight when Cancel follows Post.
constexpr size_t kLargeBytes = size_t{32} << 20;

TEST_P(KvTransportTest, CancelStopsATransfer) {
  LocalRegion local = MustAllocate(*a_, kLargeBytes);
  LocalRegion remote = MustAllocate(*b_, kLargeBytes);
  // Several transfers at once, so some are queued or streaming when cancelled.
  constexpr int kTransfers = 6;
  std::vector<std::shared_ptr<Outcome>> outcomes;
  std::vector<TransferId> ids;
  for (int i = 0; i < kTransfers; ++i) {
    outcomes.push_back(Outcome::New());
    absl::StatusOr<TransferId> id = a_->Post(
        Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), kLargeBytes}}),
        Outcome::CallbackOf(outcomes.back()));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (TransferId id : ids) a_->Cancel(id);
  int cancelled = 0;
  for (const auto& outcome : outcomes) {
    std::optional<absl::Status> status = outcome->Wait(kTransferTimeout);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(status->ok() || status->code() == absl::StatusCode::kCancelled) << *status;
    if (status->code() == absl::StatusCode::kCancelled) ++cancelled;
  }
  EXPECT_GT(cancelled, 0);
  // Cancelling one that finished, or an unknown one, does nothing.
  a_->Cancel(ids[0]);
  a_->Cancel(123456789);
  // The transport is still usable.
  ASSERT_TRUE(Reconnect());
  EXPECT_EQ(
      PostAndWait(Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), 4096}})),
      absl::OkStatus());
  for (const auto& outcome : outcomes) EXPECT_EQ(outcome->calls(), 1);
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_TRUE(DeregisterEventually(*b_, remote.id));
}

TEST_P(KvTransportTest, DeregisterFailsWhileATransferUsesTheRegion) {
  LocalRegion local = MustAllocate(*a_, kLargeBytes);
  LocalRegion remote = MustAllocate(*b_, kLargeBytes);
  auto outcome = Outcome::New();
  absl::StatusOr<TransferId> id = a_->Post(
      Request(TransferOp::kGet, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), kLargeBytes}}),
      Outcome::CallbackOf(outcome));
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Status in_use = a_->Deregister(local.id);
  a_->Cancel(*id);
  std::optional<absl::Status> status = outcome->Wait(kTransferTimeout);
  ASSERT_TRUE(status.has_value());
  if (in_use.ok()) {
    // Only a transfer that had finished (and so released the region) allows that.
    EXPECT_TRUE(status->ok()) << *status;
  } else {
    EXPECT_EQ(in_use.code(), absl::StatusCode::kFailedPrecondition) << in_use;
    EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  }
  EXPECT_TRUE(DeregisterEventually(*b_, remote.id));
}

TEST_P(KvTransportTest, InvalidRequestsAreRefusedWithoutTheCallback) {
  // 1-byte segments need kMaxSegmentsPerTransfer + 1 bytes on each side.
  constexpr size_t kBytes = kMaxSegmentsPerTransfer + 4096;
  LocalRegion local = MustAllocate(*a_, kBytes);
  LocalRegion remote = MustAllocate(*b_, kBytes);
  const uint64_t l = Addr(Ptr(local));
  const uint64_t r = Addr(Ptr(remote));
  const TransferRequest valid = Request(TransferOp::kPut, remote, {{l, r, 4096}});

  std::vector<std::pair<std::string, TransferRequest>> cases;
  auto add = [&](std::string name, std::function<void(TransferRequest&)> mutate) {
    TransferRequest request = valid;
    mutate(request);
    cases.emplace_back(std::move(name), std::move(request));
  };
  add("no segments", [](TransferRequest& q) { q.segments.clear(); });
  add("too many segments", [&](TransferRequest& q) {
    q.segments.clear();
    for (uint64_t i = 0; i <= kMaxSegmentsPerTransfer; ++i) q.segments.push_back({l + i, r + i, 1});
  });
  add("zero length", [&](TransferRequest& q) { q.segments.push_back({l + 8192, r + 8192, 0}); });
  add("put writes overlap", [&](TransferRequest& q) {
    q.segments.push_back({l + 8192, r + 100, 100});
  });
  add("get writes overlap", [&](TransferRequest& q) {
    q.op = TransferOp::kGet;
    q.segments.push_back({l + 100, r + 8192, 100});
  });
  add("past the remote region", [&](TransferRequest& q) {
    q.segments = {{l, r + kBytes - 100, 101}};
  });
  add("before the remote region", [&](TransferRequest& q) { q.segments = {{l, r - 1, 10}}; });
  add("remote region wraps", [&](TransferRequest& q) {
    q.remote.address = std::numeric_limits<uint64_t>::max() - 10;
    q.remote.length = 100;
  });
  add("local range wraps", [&](TransferRequest& q) {
    q.segments = {{std::numeric_limits<uint64_t>::max() - 10, r, 100}};
  });
  add("infinite deadline", [](TransferRequest& q) { q.deadline = absl::InfiniteFuture(); });
  add("past-infinite deadline", [](TransferRequest& q) { q.deadline = absl::InfinitePast(); });
  add("transfer_id too long",
      [](TransferRequest& q) { q.transfer_id = std::string(kMaxTransferIdBytes + 1, 'x'); });
  add("no remote key", [](TransferRequest& q) { q.remote.remote_key.clear(); });
  add("a key of no transport", [](TransferRequest& q) { q.remote.remote_key = "not-a-key"; });
  std::vector<char> unregistered(4096);
  add("unregistered local memory", [&](TransferRequest& q) {
    q.segments = {{Addr(unregistered.data()), r, 4096}};
  });
  add("local range past its region", [&](TransferRequest& q) {
    q.segments = {{l + kBytes - 100, r, 200}};
  });

  bool called = false;
  for (auto& [name, request] : cases) {
    absl::StatusOr<TransferId> id =
        a_->Post(std::move(request), [&called](absl::Status) { called = true; });
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument)
        << name << ": " << id.status();
  }
  TransferRequest unknown_peer = valid;
  unknown_peer.peer = peer_ + 1000;
  EXPECT_EQ(a_->Post(unknown_peer, [&called](absl::Status) { called = true; }).status().code(),
            absl::StatusCode::kNotFound);
  // The same request without the fault works (and lets a stray callback show up first).
  EXPECT_EQ(PostAndWait(valid), absl::OkStatus());
  EXPECT_FALSE(called);
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(remote.id), absl::OkStatus());
}

TEST_P(KvTransportTest, RemoteAccessOutsideARegionIsRefused) {
  LocalRegion local = MustAllocate(*a_, 1 << 20);
  LocalRegion remote = MustAllocate(*b_, 1 << 16);
  FillRandom(Ptr(local), 1 << 20, 6);
  // What the descriptor says is checked by every transport before anything moves.
  EXPECT_EQ(a_->Post(Request(TransferOp::kPut, remote,
                             {{Addr(Ptr(local)), Addr(Ptr(remote)) + (1 << 16), 1}}),
                     [](absl::Status) { ADD_FAILURE() << "callback of a refused Post"; })
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  if (!IsGrpc()) {
    EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
    EXPECT_EQ(b_->Deregister(remote.id), absl::OkStatus());
    GTEST_SKIP() << "forged descriptors: only the gRPC target checks accesses itself";
  }
  // A descriptor that claims more than was registered: the target refuses the excess.
  LocalRegion forged = remote;
  forged.descriptor.length = 1 << 20;
  auto awaited = Outcome::New();
  b_->AwaitNotification("forged", absl::Now() + kTransferTimeout, Outcome::CallbackOf(awaited));
  TransferRequest put = Request(TransferOp::kPut, forged,
                                {{Addr(Ptr(local)), Addr(Ptr(remote)) + (1 << 16) - 10, 20}});
  put.transfer_id = "forged";
  EXPECT_EQ(PostAndWait(std::move(put)).code(), absl::StatusCode::kOutOfRange);
  std::optional<absl::Status> told = awaited->Wait(kTransferTimeout);
  ASSERT_TRUE(told.has_value());
  EXPECT_FALSE(told->ok());  // the owner learns the failure
  EXPECT_TRUE(IsZero(Ptr(remote), 1 << 16));
  EXPECT_EQ(PostAndWait(Request(TransferOp::kGet, forged,
                                {{Addr(Ptr(local)), Addr(Ptr(remote)) + 4096, 1 << 16}}))
                .code(),
            absl::StatusCode::kOutOfRange);

  // A key whose random part is wrong.
  LocalRegion wrong_key = remote;
  wrong_key.descriptor.remote_key.back() ^= 1;
  EXPECT_EQ(
      PostAndWait(Request(TransferOp::kPut, wrong_key, {{Addr(Ptr(local)), Addr(Ptr(remote)), 16}}))
          .code(),
      absl::StatusCode::kPermissionDenied);
  // The key of a region that was deregistered.
  ASSERT_EQ(b_->Deregister(remote.id), absl::OkStatus());
  EXPECT_EQ(
      PostAndWait(Request(TransferOp::kGet, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), 16}}))
          .code(),
      absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
}

// Puts of 64 KiB or more to a peer without native RMA (UCX over tcp) travel on the owner's
// bulk-data connection (ucx_data_socket.h), which reads them straight into place: the owner checks
// every frame's region and key first, refuses the rest as over active messages, and the
// connection goes on carrying puts.
TEST_P(KvTransportTest, LargePutsOutsideARegionAreRefusedByTheOwner) {
  if (IsGrpc()) GTEST_SKIP() << "UCX over tcp (gRPC: RemoteAccessOutsideARegionIsRefused)";
  constexpr uint64_t kMiB = 1 << 20;
  LocalRegion local = MustAllocate(*a_, 4 * kMiB);
  LocalRegion remote = MustAllocate(*b_, kMiB);
  FillRandom(Ptr(local), 4 * kMiB, 7);
  // A descriptor that claims more than was registered.
  LocalRegion forged = remote;
  forged.descriptor.length = 4 * kMiB;
  auto awaited = Outcome::New();
  b_->AwaitNotification("forged-large", absl::Now() + kTransferTimeout,
                        Outcome::CallbackOf(awaited));
  TransferRequest put =
      Request(TransferOp::kPut, forged, {{Addr(Ptr(local)), Addr(Ptr(remote)) + kMiB / 2, kMiB}});
  put.transfer_id = "forged-large";
  EXPECT_EQ(PostAndWait(std::move(put)).code(), absl::StatusCode::kOutOfRange);
  std::optional<absl::Status> told = awaited->Wait(kTransferTimeout);
  ASSERT_TRUE(told.has_value());
  EXPECT_EQ(told->code(), absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(IsZero(Ptr(remote), kMiB));
  // A key whose secret is wrong (its first byte, after the 16-byte magic: ucx_wire.h).
  LocalRegion wrong_key = remote;
  wrong_key.descriptor.remote_key[16] ^= 1;
  EXPECT_EQ(PostAndWait(
                Request(TransferOp::kPut, wrong_key, {{Addr(Ptr(local)), Addr(Ptr(remote)), kMiB}}))
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(IsZero(Ptr(remote), kMiB));
  // Then a good put over the same connection lands bit-exact.
  EXPECT_EQ(PostAndWait(Request(TransferOp::kPut, remote,
                                {{Addr(Ptr(local)) + kMiB, Addr(Ptr(remote)), kMiB}})),
            absl::OkStatus());
  EXPECT_EQ(std::memcmp(Ptr(local) + kMiB, Ptr(remote), kMiB), 0);
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(remote.id), absl::OkStatus());
}

TEST_P(KvTransportTest, MetricsAppearInTheRegistry) {
  LocalRegion local = MustAllocate(*a_, 1 << 20);
  LocalRegion remote = MustAllocate(*b_, 1 << 20);
  EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfer_registered_regions",
                        {{"transport", GetParam().kind}}),
            a_regions_ + 1);
  EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfer_registered_bytes",
                        {{"transport", GetParam().kind}}),
            1 << 20);
  const std::string carrier = a_->PeerTransport(peer_);
  ASSERT_FALSE(carrier.empty());
  TransferRequest put =
      Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), 5000}});
  put.transfer_id = "metered";
  ASSERT_EQ(PostAndWait(std::move(put)), absl::OkStatus());
  ASSERT_EQ(b_->WaitNotification("metered", absl::Now() + kTransferTimeout), absl::OkStatus());
  // A failure: a get from a transport that is gone.
  absl::StatusOr<std::unique_ptr<KvTransport>> c = KvTransport::Create(Options(nullptr));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<PeerId> peer_c = a_->Connect((*c)->address());
  ASSERT_TRUE(peer_c.ok()) << peer_c.status();
  ASSERT_EQ(a_->PeerTransport(*peer_c), carrier);
  LocalRegion gone = MustAllocate(**c, 4096);
  ASSERT_EQ((*c)->Deregister(gone.id), absl::OkStatus());
  c->reset();
  TransferRequest get =
      Request(TransferOp::kGet, gone, {{Addr(Ptr(local)), gone.descriptor.address, 4096}});
  get.peer = *peer_c;
  auto outcome = Outcome::New();
  absl::StatusOr<TransferId> posted = a_->Post(std::move(get), Outcome::CallbackOf(outcome));
  std::optional<absl::Status> failed;
  if (posted.ok()) {
    failed = outcome->Wait(kTransferTimeout + kSlack);
    ASSERT_TRUE(failed.has_value());
    ASSERT_FALSE(failed->ok());
  }

  const std::map<std::string, std::string> put_labels = {{"transport", carrier}, {"op", "put"}};
  const std::map<std::string, std::string> get_labels = {{"transport", carrier}, {"op", "get"}};
  EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfer_bytes_total", put_labels), 5000);
  EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfers_total", put_labels), 1);
  EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfer_seconds", put_labels), 1);
  if (failed.has_value()) {
    EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfers_total", get_labels), 1);
    EXPECT_EQ(
        MetricValue(
            registry_a_, "ferry_kv_transfer_failures_total",
            {{"transport", carrier}, {"op", "get"}, {"code", StatusCodeLabel(failed->code())}}),
        1);
  } else {
    // Refused by Post (the transport already knew the peer had failed): no transfer to count.
    EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfers_total", get_labels), std::nullopt);
  }
  EXPECT_EQ(MetricValue(registry_b_, "ferry_kv_transfer_notifications_total",
                        {{"transport", GetParam().kind}, {"outcome", "ok"}}),
            1);

  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(remote.id), absl::OkStatus());
  EXPECT_EQ(MetricValue(registry_a_, "ferry_kv_transfer_registered_regions",
                        {{"transport", GetParam().kind}}),
            a_regions_);
}

TEST_P(KvTransportTest, TransfersEndAtTheirDeadlines) {
  LocalRegion local = MustAllocate(*a_, kLargeBytes);
  LocalRegion remote = MustAllocate(*b_, kLargeBytes);
  for (TransferOp op : {TransferOp::kPut, TransferOp::kGet}) {
    SCOPED_TRACE(TransferOpName(op));
    ASSERT_TRUE(Reconnect());
    // Already past: nothing can move by then.
    EXPECT_EQ(PostAndWait(Request(op, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), 4096}},
                                  absl::Milliseconds(-1)))
                  .code(),
              absl::StatusCode::kDeadlineExceeded);
    // Far too short for the bytes: the transfer is cut off at its deadline.
    ASSERT_TRUE(Reconnect());
    const absl::Duration timeout = absl::Milliseconds(2);
    const absl::Time start = absl::Now();
    EXPECT_EQ(PostAndWait(Request(op, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), kLargeBytes}},
                                  timeout))
                  .code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_LT(absl::Now() - start, timeout + kSlack);
  }
  ASSERT_TRUE(Reconnect());
  EXPECT_EQ(
      PostAndWait(Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), 4096}})),
      absl::OkStatus());
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_TRUE(DeregisterEventually(*b_, remote.id));
}

TEST_P(KvTransportTest, ConnectAndDisconnect) {
  absl::StatusOr<PeerId> again = a_->Connect(b_->address());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, peer_);
  EXPECT_FALSE(a_->PeerTransport(peer_).empty());
  EXPECT_EQ(a_->PeerTransport(peer_ + 1000), "");
  EXPECT_EQ(a_->Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  if (IsGrpc()) {
    for (const char* bad :
         {"nohost", "host:", ":80", "host:99999", "host:8x", "[::1:80", "a:b:80"}) {
      EXPECT_EQ(a_->Connect(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
  }

  // Disconnect fails the peer's transfers and forgets it.
  LocalRegion local = MustAllocate(*a_, kLargeBytes);
  LocalRegion remote = MustAllocate(*b_, kLargeBytes);
  auto outcome = Outcome::New();
  ASSERT_TRUE(a_->Post(Request(TransferOp::kPut, remote,
                               {{Addr(Ptr(local)), Addr(Ptr(remote)), kLargeBytes}}),
                       Outcome::CallbackOf(outcome))
                  .ok());
  a_->Disconnect(peer_);
  std::optional<absl::Status> status = outcome->Wait(kTransferTimeout);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok() || status->code() == absl::StatusCode::kCancelled) << *status;
  // The peer is unknown (NotFound) or closed (Unavailable) from now on.
  const absl::StatusCode refused =
      a_->Post(Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), 16}}),
               [](absl::Status) { ADD_FAILURE() << "callback of a refused Post"; })
          .status()
          .code();
  EXPECT_TRUE(refused == absl::StatusCode::kNotFound || refused == absl::StatusCode::kUnavailable)
      << refused;
  if (IsGrpc()) {
    EXPECT_EQ(refused, absl::StatusCode::kNotFound);
    EXPECT_EQ(a_->PeerTransport(peer_), "");
  }
  absl::StatusOr<PeerId> fresh = a_->Connect(b_->address());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(*fresh, peer_);
  peer_ = *fresh;
  EXPECT_EQ(
      PostAndWait(Request(TransferOp::kPut, remote, {{Addr(Ptr(local)), Addr(Ptr(remote)), 16}})),
      absl::OkStatus());
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_TRUE(DeregisterEventually(*b_, remote.id));
}

TEST_P(KvTransportTest, CallbacksMayPost) {
  LocalRegion local = MustAllocate(*a_, 1 << 16);
  LocalRegion remote = MustAllocate(*b_, 1 << 16);
  FillRandom(Ptr(local), 1 << 16, 8);
  // Three puts in a chain, each posted from the callback of the one before.
  auto last = Outcome::New();
  std::function<void(int, absl::Status)> next = [&](int i, absl::Status status) {
    if (!status.ok() || i == 3) {
      Outcome::CallbackOf(last)(status);
      return;
    }
    const size_t offset = i * 4096;
    absl::StatusOr<TransferId> id =
        a_->Post(Request(TransferOp::kPut, remote,
                         {{Addr(Ptr(local) + offset), Addr(Ptr(remote) + offset), 4096}}),
                 [&next, i](absl::Status s) { next(i + 1, std::move(s)); });
    if (!id.ok()) Outcome::CallbackOf(last)(id.status());
  };
  next(0, absl::OkStatus());
  std::optional<absl::Status> status = last->Wait(kTransferTimeout);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->ok()) << *status;
  EXPECT_NE(last->thread(), std::this_thread::get_id());
  EXPECT_EQ(std::memcmp(Ptr(local), Ptr(remote), 3 * 4096), 0);
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
  EXPECT_EQ(b_->Deregister(remote.id), absl::OkStatus());
}

TEST_P(KvTransportTest, DestroyingATransportEndsEverythingPending) {
  LocalRegion local = MustAllocate(*a_, kLargeBytes);
  LocalRegion remote = MustAllocate(*b_, kLargeBytes);
  std::vector<std::shared_ptr<Outcome>> outcomes;
  for (int i = 0; i < 8; ++i) {
    outcomes.push_back(Outcome::New());
    ASSERT_TRUE(a_->Post(Request(TransferOp::kPut, remote,
                                 {{Addr(Ptr(local)), Addr(Ptr(remote)), kLargeBytes}}),
                         Outcome::CallbackOf(outcomes.back()))
                    .ok());
  }
  auto awaited = Outcome::New();
  a_->AwaitNotification("never", absl::Now() + absl::Seconds(60), Outcome::CallbackOf(awaited));
  const absl::Time start = absl::Now();
  a_.reset();  // frees `local` too
  EXPECT_LT(absl::Now() - start, kSlack + absl::Seconds(3));
  for (const auto& outcome : outcomes) {
    // Every callback has run, once, by the time the destructor returns.
    ASSERT_EQ(outcome->calls(), 1);
    std::optional<absl::Status> status = outcome->Wait(absl::ZeroDuration());
    EXPECT_TRUE(status->ok() || status->code() == absl::StatusCode::kCancelled ||
                status->code() == absl::StatusCode::kUnavailable)
        << *status;
  }
  ASSERT_EQ(awaited->calls(), 1);
  EXPECT_EQ(awaited->Wait(absl::ZeroDuration())->code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(DeregisterEventually(*b_, remote.id));
}

TEST_P(KvTransportTest, DestroyingTheTargetMidTransferEndsTheTransfers) {
  LocalRegion local = MustAllocate(*a_, 2 * kLargeBytes);
  LocalRegion remote = MustAllocate(*b_, 2 * kLargeBytes);
  std::vector<std::shared_ptr<Outcome>> outcomes;
  for (TransferOp op : {TransferOp::kPut, TransferOp::kGet}) {
    const size_t offset = op == TransferOp::kPut ? 0 : kLargeBytes;
    outcomes.push_back(Outcome::New());
    ASSERT_TRUE(
        a_->Post(Request(op, remote,
                         {{Addr(Ptr(local) + offset), Addr(Ptr(remote) + offset), kLargeBytes}}),
                 Outcome::CallbackOf(outcomes.back()))
            .ok());
  }
  b_.reset();  // frees `remote` too
  for (const auto& outcome : outcomes) {
    // OK if it was through before the target went; an error otherwise; never a hang.
    EXPECT_TRUE(outcome->Wait(kTransferTimeout + kSlack).has_value());
  }
  EXPECT_EQ(a_->Deregister(local.id), absl::OkStatus());
}

INSTANTIATE_TEST_SUITE_P(Transports, KvTransportTest,
                         testing::Values(TransportParam{"grpc", ""}, TransportParam{"ucx", "tcp"}),
                         ParamName);

// --- Without a transport ---

TEST(ValidateTransferRequestTest, AcceptsTheLimitsAndRefusesBeyondThem) {
  TransferRequest request;
  request.remote = {0x10000, 0x20000, "key"};
  request.deadline = absl::Now() + absl::Seconds(1);
  request.segments = {{0x500000, 0x10000, 0x100}};
  EXPECT_TRUE(ValidateTransferRequest(request).ok());

  // Exactly at the limits.
  TransferRequest at_limits = request;
  at_limits.transfer_id = std::string(kMaxTransferIdBytes, 'x');
  at_limits.segments.clear();
  for (uint64_t i = 0; i < kMaxSegmentsPerTransfer; ++i) {
    at_limits.segments.push_back({0x500000 + i, 0x10000 + i, 1});
  }
  EXPECT_TRUE(ValidateTransferRequest(at_limits).ok());
  at_limits.segments.push_back({0x600000, 0x2ffff, 1});
  EXPECT_EQ(ValidateTransferRequest(at_limits).code(), absl::StatusCode::kInvalidArgument);

  // A segment ending at the region's end is inside; one byte more is not.
  TransferRequest edge = request;
  edge.segments = {{0x500000, 0x2ff00, 0x100}};
  EXPECT_TRUE(ValidateTransferRequest(edge).ok());
  edge.segments = {{0x500000, 0x2ff00, 0x101}};
  EXPECT_EQ(ValidateTransferRequest(edge).code(), absl::StatusCode::kInvalidArgument);
  edge.segments = {{0x500000, 0x2ff00, std::numeric_limits<uint64_t>::max()}};
  EXPECT_EQ(ValidateTransferRequest(edge).code(), absl::StatusCode::kInvalidArgument);

  // Adjacent writes are fine; overlapping ones are not; overlapping reads are fine.
  TransferRequest put = request;
  put.segments = {{0x500000, 0x10000, 0x100}, {0x500000, 0x10100, 0x100}};
  EXPECT_TRUE(ValidateTransferRequest(put).ok());
  put.segments[1].remote_address = 0x100ff;
  EXPECT_EQ(ValidateTransferRequest(put).code(), absl::StatusCode::kInvalidArgument);
  TransferRequest get = request;
  get.op = TransferOp::kGet;
  get.segments = {{0x500000, 0x10000, 0x100}, {0x500080, 0x10000, 0x100}};
  EXPECT_EQ(ValidateTransferRequest(get).code(), absl::StatusCode::kInvalidArgument);
  get.segments[1].local_address = 0x500100;
  EXPECT_TRUE(ValidateTransferRequest(get).ok());

  TransferRequest no_deadline = request;
  no_deadline.deadline = absl::InfiniteFuture();
  EXPECT_EQ(ValidateTransferRequest(no_deadline).code(), absl::StatusCode::kInvalidArgument);
  TransferRequest no_key = request;
  no_key.remote.remote_key.clear();
  EXPECT_EQ(ValidateTransferRequest(no_key).code(), absl::StatusCode::kInvalidArgument);
  TransferRequest empty = request;
  empty.segments.clear();
  EXPECT_EQ(ValidateTransferRequest(empty).code(), absl::StatusCode::kInvalidArgument);
  TransferRequest zero = request;
  zero.segments[0].length = 0;
  EXPECT_EQ(ValidateTransferRequest(zero).code(), absl::StatusCode::kInvalidArgument);
}

// --- The gRPC transport's server, fed messages no transport would send ---

// Runs one call of `method` on `channel` with raw request messages (half-closing after the last);
// its status.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto next = [&cq] {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    return ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, method, &cq);
  call->StartCall(&cq);
  bool ok = next();
  for (size_t i = 0; i < messages.size() && ok; ++i) {
    grpc::Slice slice(messages[i]);
    grpc::ByteBuffer buffer(&slice, 1);
    if (i + 1 == messages.size()) {
      call->WriteLast(buffer, grpc::WriteOptions(), &cq);
    } else {
      call->Write(buffer, &cq);
    }
    ok = next();
  }
  grpc::ByteBuffer response;
  while (ok) {
    call->Read(&response, &cq);
    ok = next();
  }
  grpc::Status status;
  call->Finish(&status, &cq);
  next();
  cq.Shutdown();
  void* tag;
  while (cq.Next(&tag, &ok)) {
  }
  return status;
}

std::string WriteChunk(const std::string& key, const std::string& transfer_id, uint64_t address,
                       const std::string& data) {
  v1::TransferWriteChunk chunk;
  chunk.set_remote_key(key);
  chunk.set_transfer_id(transfer_id);
  chunk.set_remote_address(address);
  chunk.set_data(data);
  return chunk.SerializeAsString();
}

TEST(GrpcTransportServerTest, MalformedMessagesAreRefusedAndTouchNothing) {
  TransportOptions options;
  options.kind = "grpc";
  absl::StatusOr<std::unique_ptr<KvTransport>> transport = KvTransport::Create(options);
  ASSERT_TRUE(transport.ok()) << transport.status();
  constexpr size_t kBytes = 1 << 16;
  absl::StatusOr<LocalRegion> region = (*transport)->Allocate(kBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  const std::string& key = region->descriptor.remote_key;
  const uint64_t base = region->descriptor.address;
  // A neighbour whose bytes must survive everything below.
  absl::StatusOr<LocalRegion> neighbour = (*transport)->Allocate(kBytes);
  ASSERT_TRUE(neighbour.ok()) << neighbour.status();
  FillRandom(Ptr(*neighbour), kBytes, 11);
  const std::vector<char> neighbour_bytes(Ptr(*neighbour), Ptr(*neighbour) + kBytes);
  auto awaited = Outcome::New();
  (*transport)
      ->AwaitNotification("victim", absl::Now() + absl::Seconds(60), Outcome::CallbackOf(awaited));

  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel((*transport)->address(), grpc::InsecureChannelCredentials());
  const std::string write = "/ferry.v1.KvTransfer/Write";
  const std::string read = "/ferry.v1.KvTransfer/Read";
  const std::string data(100, 'x');
  std::string forged_key = key;
  forged_key.back() ^= 1;
  std::string wrong_length = WriteChunk(key, "", base, data);
  wrong_length[wrong_length.size() - data.size() - 1] = 101;  // the data claims one byte more
  // The data field before the address (valid protobuf, but the address comes too late).
  v1::TransferWriteChunk address_only;
  address_only.set_remote_address(base);
  const std::string data_first = WriteChunk(key, "", 0, data) + address_only.SerializeAsString();
  struct Case {
    std::string name;
    std::vector<std::string> messages;
    grpc::StatusCode code;
  };
  const std::vector<Case> cases = {
      {"garbage", {"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"}, grpc::INVALID_ARGUMENT},
      {"unknown field", {"\x48\x01"}, grpc::INVALID_ARGUMENT},
      {"truncated varint", {"\x18\x80"}, grpc::INVALID_ARGUMENT},
      {"no key", {WriteChunk("", "victim", base, data)}, grpc::PERMISSION_DENIED},
      {"forged key", {WriteChunk(forged_key, "victim", base, data)}, grpc::PERMISSION_DENIED},
      {"a key of nothing",
       {WriteChunk(std::string(28, 'k'), "victim", base, data)},
       grpc::PERMISSION_DENIED},
      {"past the region", {WriteChunk(key, "", base + kBytes - 50, data)}, grpc::OUT_OF_RANGE},
      {"before the region", {WriteChunk(key, "", base - 1, data)}, grpc::OUT_OF_RANGE},
      {"into the neighbour",
       {WriteChunk(key, "", neighbour->descriptor.address, data)},
       grpc::OUT_OF_RANGE},
      {"wrapping", {WriteChunk(key, "", ~uint64_t{0} - 10, data)}, grpc::OUT_OF_RANGE},
      {"data longer than the message", {wrong_length}, grpc::INVALID_ARGUMENT},
      {"data before the address", {data_first}, grpc::OUT_OF_RANGE},
      {"key again later",
       {WriteChunk(key, "", base, data), WriteChunk(key, "", base, data)},
       grpc::INVALID_ARGUMENT},
      {"transfer_id too long",
       {WriteChunk(key, std::string(kMaxTransferIdBytes + 1, 't'), base, data)},
       grpc::INVALID_ARGUMENT},
  };
  for (const Case& c : cases) {
    const grpc::Status status = RawCall(channel, write, c.messages);
    EXPECT_EQ(status.error_code(), c.code) << c.name << ": " << status.error_message();
  }
  // Random messages after a valid first one.
  std::mt19937_64 rng(12);
  for (int i = 0; i < 200; ++i) {
    std::string noise(rng() % 64, '\0');
    for (char& ch : noise) ch = static_cast<char>(rng());
    const grpc::StatusCode code =
        RawCall(channel, write, {WriteChunk(key, "", base, std::string(8, 'r')), noise})
            .error_code();
    EXPECT_TRUE(code == grpc::OK || code == grpc::INVALID_ARGUMENT ||
                code == grpc::PERMISSION_DENIED || code == grpc::OUT_OF_RANGE)
        << code;
  }
  EXPECT_EQ(std::memcmp(Ptr(*neighbour), neighbour_bytes.data(), kBytes), 0);
  // A caller without a key tells the owner nothing.
  EXPECT_EQ(awaited->calls(), 0);

  // Reads.
  v1::TransferReadRequest get;
  get.set_remote_key(key);
  v1::TransferRange* range = get.add_ranges();
  range->set_remote_address(base + kBytes - 10);
  range->set_length(11);
  EXPECT_EQ(RawCall(channel, read, {get.SerializeAsString()}).error_code(), grpc::OUT_OF_RANGE);
  range->set_length(0);
  EXPECT_EQ(RawCall(channel, read, {get.SerializeAsString()}).error_code(), grpc::INVALID_ARGUMENT);
  get.set_remote_key(forged_key);
  range->set_length(10);
  EXPECT_EQ(RawCall(channel, read, {get.SerializeAsString()}).error_code(),
            grpc::PERMISSION_DENIED);
  EXPECT_EQ(RawCall(channel, read, {"\xff\xff\xff"}).error_code(), grpc::INVALID_ARGUMENT);
  get.set_remote_key(key);
  get.clear_ranges();
  EXPECT_EQ(RawCall(channel, read, {get.SerializeAsString()}).error_code(), grpc::INVALID_ARGUMENT);

  EXPECT_EQ((*transport)->Deregister(region->id), absl::OkStatus());
  EXPECT_EQ((*transport)->Deregister(neighbour->id), absl::OkStatus());
}

// A transport with a shared token refuses Write, Read and Notify calls without it (before
// looking at the region key) and touches nothing; a peer with the token puts and gets, a peer
// with another token or none fails UNAUTHENTICATED.
TEST(GrpcTransportServerTest, ASharedTokenGuardsEveryCall) {
  auto make = [](const std::string& token) {
    TransportOptions options;
    options.kind = "grpc";
    options.auth_token = SharedToken(token);
    absl::StatusOr<std::unique_ptr<KvTransport>> t = KvTransport::Create(options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  };
  const std::string token = "transfer-token-0123456789";
  std::unique_ptr<KvTransport> owner = make(token), friendly = make(token),
                               stranger = make("transfer-token-987654321"), anonymous = make("");
  ASSERT_TRUE(owner && friendly && stranger && anonymous);
  constexpr size_t kBytes = 1 << 16;
  absl::StatusOr<LocalRegion> dst = owner->Allocate(kBytes);
  ASSERT_TRUE(dst.ok()) << dst.status();
  std::memset(Ptr(*dst), 0, kBytes);
  auto transfer = [&](KvTransport& from, TransferOp op) {
    absl::StatusOr<LocalRegion> src = from.Allocate(kBytes);
    EXPECT_TRUE(src.ok()) << src.status();
    FillRandom(Ptr(*src), kBytes, 5);
    absl::StatusOr<PeerId> peer = from.Connect(owner->address());
    EXPECT_TRUE(peer.ok()) << peer.status();
    TransferRequest request;
    request.peer = *peer;
    request.op = op;
    request.remote = dst->descriptor;
    request.segments = {{Addr(Ptr(*src)), dst->descriptor.address, kBytes}};
    request.deadline = absl::Now() + absl::Seconds(20);
    auto outcome = Outcome::New();
    absl::StatusOr<TransferId> id = from.Post(std::move(request), Outcome::CallbackOf(outcome));
    EXPECT_TRUE(id.ok()) << id.status();
    std::optional<absl::Status> status = outcome->Wait(absl::Seconds(30));
    EXPECT_EQ(from.Deregister(src->id), absl::OkStatus());
    return status.value_or(absl::InternalError("no callback"));
  };
  for (KvTransport* t : {stranger.get(), anonymous.get()}) {
    EXPECT_EQ(transfer(*t, TransferOp::kPut).code(), absl::StatusCode::kUnauthenticated);
    EXPECT_EQ(transfer(*t, TransferOp::kGet).code(), absl::StatusCode::kUnauthenticated);
  }
  EXPECT_TRUE(IsZero(Ptr(*dst), kBytes)) << "an unauthenticated put wrote";
  EXPECT_EQ(transfer(*friendly, TransferOp::kPut), absl::OkStatus());
  EXPECT_FALSE(IsZero(Ptr(*dst), kBytes));
  EXPECT_EQ(transfer(*friendly, TransferOp::kGet), absl::OkStatus());

  // Raw calls with the region's own key but no token.
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(owner->address(), grpc::InsecureChannelCredentials());
  const std::string& key = dst->descriptor.remote_key;
  EXPECT_EQ(RawCall(channel, "/ferry.v1.KvTransfer/Write",
                    {WriteChunk(key, "", dst->descriptor.address, std::string(8, 'z'))})
                .error_code(),
            grpc::UNAUTHENTICATED);
  v1::TransferReadRequest get;
  get.set_remote_key(key);
  v1::TransferRange* range = get.add_ranges();
  range->set_remote_address(dst->descriptor.address);
  range->set_length(8);
  EXPECT_EQ(RawCall(channel, "/ferry.v1.KvTransfer/Read", {get.SerializeAsString()}).error_code(),
            grpc::UNAUTHENTICATED);
  v1::TransferNotifyRequest notify;
  notify.set_transfer_id("t");
  notify.set_remote_key(key);
  EXPECT_EQ(
      RawCall(channel, "/ferry.v1.KvTransfer/Notify", {notify.SerializeAsString()}).error_code(),
      grpc::UNAUTHENTICATED);
  EXPECT_EQ(owner->Deregister(dst->id), absl::OkStatus());
}

// Listening on every interface, the gRPC transport advertises the host its options name (or
// refuses to start without one); a token rotated on the owner (new and old accepted, then only
// the new) lets a peer that still sends the old one in until the old is dropped.
TEST(GrpcTransportServerTest, AWildcardListenerAdvertisesItsHostAndTakesARotatedToken) {
  const std::string old_token = "transfer-token-0123456789",
                    new_token = "transfer-token-abcdefghij";
  TransportOptions options;
  options.kind = "grpc";
  options.listen_address = "0.0.0.0:0";
  options.auth_token = SharedToken(old_token);
  EXPECT_EQ(KvTransport::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.advertise_host = "127.0.0.1";
  absl::StatusOr<std::unique_ptr<KvTransport>> owner = KvTransport::Create(options);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_TRUE(absl::StartsWith((*owner)->address(), "127.0.0.1:")) << (*owner)->address();
  EXPECT_NE((*owner)->address(), "127.0.0.1:0");
  TransportOptions peer_options;
  peer_options.kind = "grpc";
  peer_options.auth_token = SharedToken(old_token);
  absl::StatusOr<std::unique_ptr<KvTransport>> peer = KvTransport::Create(peer_options);
  ASSERT_TRUE(peer.ok()) << peer.status();
  constexpr size_t kBytes = 4096;
  absl::StatusOr<LocalRegion> dst = (*owner)->Allocate(kBytes);
  ASSERT_TRUE(dst.ok()) << dst.status();
  absl::StatusOr<LocalRegion> src = (*peer)->Allocate(kBytes);
  ASSERT_TRUE(src.ok()) << src.status();
  auto put = [&] {
    absl::StatusOr<PeerId> id = (*peer)->Connect((*owner)->address());
    EXPECT_TRUE(id.ok()) << id.status();
    TransferRequest request;
    request.peer = *id;
    request.op = TransferOp::kPut;
    request.remote = dst->descriptor;
    request.segments = {{Addr(Ptr(*src)), dst->descriptor.address, kBytes}};
    request.deadline = absl::Now() + absl::Seconds(20);
    auto outcome = Outcome::New();
    EXPECT_TRUE((*peer)->Post(std::move(request), Outcome::CallbackOf(outcome)).ok());
    return outcome->Wait(absl::Seconds(30)).value_or(absl::InternalError("no callback"));
  };
  EXPECT_EQ(put(), absl::OkStatus());
  options.auth_token.Set({new_token, old_token});  // the owner's copy: the same handle
  EXPECT_EQ(put(), absl::OkStatus());
  options.auth_token.Set({new_token});
  EXPECT_EQ(put().code(), absl::StatusCode::kUnauthenticated);
  peer_options.auth_token.Set({new_token});
  EXPECT_EQ(put(), absl::OkStatus());
  EXPECT_EQ((*peer)->Deregister(src->id), absl::OkStatus());
  EXPECT_EQ((*owner)->Deregister(dst->id), absl::OkStatus());
}

TEST(TransportKvAllocatorTest, AKvBlockPoolOnTransportMemoryMovesBetweenTransports) {
  TransportOptions options;
  options.kind = "grpc";
  absl::StatusOr<std::unique_ptr<KvTransport>> a = KvTransport::Create(options);
  absl::StatusOr<std::unique_ptr<KvTransport>> b = KvTransport::Create(options);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend = CpuBackend::Create({1, std::nullopt});
  ASSERT_TRUE(backend.ok()) << backend.status();

  KvBlockLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 16;
  layout.block_tokens = 8;
  layout.dtype = DType::kBF16;
  {
    TransportKvAllocator allocator_a(a->get());
    TransportKvAllocator allocator_b(b->get());
    absl::StatusOr<std::unique_ptr<KvBlockPool>> pool_a =
        KvBlockPool::Create(layout, 16, &allocator_a, backend->get());
    absl::StatusOr<std::unique_ptr<KvBlockPool>> pool_b =
        KvBlockPool::Create(layout, 16, &allocator_b, backend->get());
    ASSERT_TRUE(pool_a.ok()) << pool_a.status();
    ASSERT_TRUE(pool_b.ok()) << pool_b.status();
    EXPECT_EQ((*a)->registered_regions(), 1);
    absl::StatusOr<LocalRegion> region_b = allocator_b.RegionOf((*pool_b)->region().address);
    ASSERT_TRUE(region_b.ok()) << region_b.status();
    EXPECT_EQ(region_b->span.length, (*pool_b)->region().length);
    EXPECT_EQ(allocator_b.RegionOf(&layout).status().code(), absl::StatusCode::kNotFound);
    // Every 4 KiB page of the pool starts with a byte set (see the header), the rest is zeros.
    const auto* memory = static_cast<const unsigned char*>((*pool_b)->region().address);
    size_t marked = 0, nonzero = 0;
    for (size_t i = 0; i < (*pool_b)->region().length; ++i) {
      nonzero += memory[i] != 0;
      marked += i % 4096 == 0 && memory[i] == 1;
    }
    EXPECT_EQ(marked, ((*pool_b)->region().length + 4095) / 4096);
    EXPECT_EQ(nonzero, marked);

    // Three blocks of A's pool go to three other blocks of B's pool.
    absl::StatusOr<std::vector<BlockId>> blocks_a = (*pool_a)->Allocate(3);
    absl::StatusOr<std::vector<BlockId>> blocks_b = (*pool_b)->Allocate(5);
    ASSERT_TRUE(blocks_a.ok() && blocks_b.ok());
    const std::vector<BlockId> targets = {(*blocks_b)[4], (*blocks_b)[0], (*blocks_b)[2]};
    std::vector<char> bytes(3 * layout.block_bytes());
    FillRandom(bytes.data(), bytes.size(), 9);
    ASSERT_TRUE((*pool_a)->Import(*blocks_a, bytes.data(), bytes.size()).ok());
    absl::StatusOr<std::vector<MemorySpan>> from = (*pool_a)->Spans(*blocks_a);
    absl::StatusOr<std::vector<MemorySpan>> to = (*pool_b)->Spans(targets);
    ASSERT_TRUE(from.ok() && to.ok());

    absl::StatusOr<PeerId> peer = (*a)->Connect((*b)->address());
    ASSERT_TRUE(peer.ok()) << peer.status();
    TransferRequest put;
    put.peer = *peer;
    put.remote = region_b->descriptor;
    put.deadline = absl::Now() + kTransferTimeout;
    for (int i = 0; i < 3; ++i) {
      put.segments.push_back({Addr((*from)[i].address), Addr((*to)[i].address), (*from)[i].length});
    }
    ASSERT_EQ((*a)->Transfer(std::move(put)), absl::OkStatus());
    std::vector<char> received(bytes.size());
    ASSERT_TRUE((*pool_b)->ExportToHost(targets, received.data(), received.size()).ok());
    EXPECT_EQ(received, bytes);
  }
  // The pools freed their memory through the allocators.
  EXPECT_EQ((*a)->registered_regions(), 0);
  EXPECT_EQ((*b)->registered_regions(), 0);
}

TEST(TransferWireTest, DescriptorsRoundTrip) {
  for (const char* kind : {"grpc", "ucx"}) {
    PeerDescriptor descriptor;
    descriptor.kind = kind;
    descriptor.address = std::string("127.0.0.1:5\0binary", 18);
    descriptor.regions = {{0x1000, 0x2000, "key-1"}, {0x7f0000000000, 1, std::string(80, '\xff')}};
    descriptor.transfer_id = "req-9";
    absl::StatusOr<PeerDescriptor> back = FromProto(ToProto(descriptor));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->kind, descriptor.kind);
    EXPECT_EQ(back->address, descriptor.address);
    EXPECT_EQ(back->transfer_id, descriptor.transfer_id);
    ASSERT_EQ(back->regions.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(back->regions[i].address, descriptor.regions[i].address);
      EXPECT_EQ(back->regions[i].length, descriptor.regions[i].length);
      EXPECT_EQ(back->regions[i].remote_key, descriptor.regions[i].remote_key);
    }
  }
}

TEST(TransferWireTest, MalformedDescriptorsAreRefused) {
  PeerDescriptor good;
  good.kind = "grpc";
  good.address = "127.0.0.1:5";
  good.regions = {{0x1000, 0x2000, "key"}};
  ASSERT_TRUE(FromProto(ToProto(good)).ok());

  PeerDescriptor unknown = good;
  unknown.kind = "carrier-pigeon";
  EXPECT_EQ(FromProto(ToProto(unknown)).status().code(), absl::StatusCode::kInvalidArgument);
  PeerDescriptor no_address = good;
  no_address.address.clear();
  EXPECT_EQ(FromProto(ToProto(no_address)).status().code(), absl::StatusCode::kInvalidArgument);
  PeerDescriptor no_key = good;
  no_key.regions[0].remote_key.clear();
  EXPECT_EQ(FromProto(ToProto(no_key)).status().code(), absl::StatusCode::kInvalidArgument);
  PeerDescriptor wraps = good;
  wraps.regions[0] = {std::numeric_limits<uint64_t>::max() - 5, 10, "key"};
  EXPECT_EQ(FromProto(ToProto(wraps)).status().code(), absl::StatusCode::kInvalidArgument);
}

// --- NotificationBoard ---

class NotificationBoardTest : public testing::Test {
 protected:
  std::shared_ptr<Outcome> Await(NotificationBoard& board, const std::string& id,
                                 absl::Duration timeout) {
    auto outcome = Outcome::New();
    board.Await(id, absl::Now() + timeout, Outcome::CallbackOf(outcome));
    return outcome;
  }
  static absl::StatusCode CodeOf(const std::shared_ptr<Outcome>& outcome, absl::Duration timeout) {
    std::optional<absl::Status> status = outcome->Wait(timeout);
    EXPECT_TRUE(status.has_value()) << "no outcome in time";
    return status.has_value() ? status->code() : absl::StatusCode::kInternal;
  }

  prometheus::Registry registry_;
  TransferMetrics metrics_{&registry_};
};

TEST_F(NotificationBoardTest, OutcomesMeetTheirAwaitsInEitherOrder) {
  NotificationBoard board(absl::Seconds(60), 16, &metrics_, "test");
  // Await first.
  auto first = Await(board, "a", absl::Seconds(30));
  EXPECT_EQ(board.pending_awaits(), 1u);
  board.Deliver("a", absl::OkStatus());
  EXPECT_EQ(CodeOf(first, kSlack), absl::StatusCode::kOk);
  // The callback ran on the board's thread, not inside Await or Deliver.
  EXPECT_NE(first->thread(), std::this_thread::get_id());

  // Outcome first: kept until the await, errors too.
  board.Deliver("b", absl::AbortedError("stream broke"));
  board.Deliver("b", absl::OkStatus());  // a second outcome is dropped
  EXPECT_EQ(board.early_outcomes(), 1u);
  EXPECT_EQ(CodeOf(Await(board, "b", absl::Seconds(30)), kSlack), absl::StatusCode::kAborted);
  EXPECT_EQ(board.early_outcomes(), 0u);
  EXPECT_EQ(board.pending_awaits(), 0u);

  EXPECT_EQ(MetricValue(registry_, "ferry_kv_transfer_notifications_total",
                        {{"transport", "test"}, {"outcome", "ok"}}),
            1);
  EXPECT_EQ(MetricValue(registry_, "ferry_kv_transfer_notifications_total",
                        {{"transport", "test"}, {"outcome", "failed"}}),
            1);
}

TEST_F(NotificationBoardTest, EarlyOutcomesExpire) {
  NotificationBoard board(absl::Milliseconds(50), 16, &metrics_, "test");
  board.Deliver("a", absl::OkStatus());
  EXPECT_EQ(board.early_outcomes(), 1u);
  ASSERT_TRUE(Eventually([&] { return board.early_outcomes() == 0; }, absl::Seconds(5)));
  EXPECT_EQ(CodeOf(Await(board, "a", absl::Milliseconds(100)), kSlack + absl::Seconds(1)),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(NotificationBoardTest, TooManyEarlyOutcomesDropTheOldest) {
  NotificationBoard board(absl::Seconds(60), 2, &metrics_, "test");
  board.Deliver("a", absl::OkStatus());
  board.Deliver("b", absl::OkStatus());
  board.Deliver("c", absl::OkStatus());
  EXPECT_EQ(board.early_outcomes(), 2u);
  EXPECT_EQ(CodeOf(Await(board, "b", absl::Seconds(30)), kSlack), absl::StatusCode::kOk);
  EXPECT_EQ(CodeOf(Await(board, "c", absl::Seconds(30)), kSlack), absl::StatusCode::kOk);
  EXPECT_EQ(CodeOf(Await(board, "a", absl::Milliseconds(100)), kSlack + absl::Seconds(1)),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(NotificationBoardTest, AwaitsEndAtTheirDeadlines) {
  NotificationBoard board(absl::Seconds(60), 16, &metrics_, "test");
  const absl::Time start = absl::Now();
  auto late = Await(board, "late", absl::Milliseconds(400));
  auto soon = Await(board, "soon", absl::Milliseconds(100));
  EXPECT_EQ(CodeOf(soon, kSlack + absl::Seconds(1)), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(CodeOf(late, kSlack + absl::Seconds(1)), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(395));
  EXPECT_EQ(board.pending_awaits(), 0u);
  EXPECT_EQ(MetricValue(registry_, "ferry_kv_transfer_notifications_total",
                        {{"transport", "test"}, {"outcome", "deadline_exceeded"}}),
            2);
}

TEST_F(NotificationBoardTest, ASecondAwaitOnAnIdIsRefused) {
  NotificationBoard board(absl::Seconds(60), 16, &metrics_, "test");
  auto first = Await(board, "x", absl::Seconds(30));
  EXPECT_EQ(CodeOf(Await(board, "x", absl::Seconds(30)), kSlack), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(first->calls(), 0);
  board.Deliver("x", absl::OkStatus());
  EXPECT_EQ(CodeOf(first, kSlack), absl::StatusCode::kOk);
}

TEST_F(NotificationBoardTest, ShutdownCancelsAwaits) {
  NotificationBoard board(absl::Seconds(60), 16, &metrics_, "test");
  auto pending = Await(board, "x", absl::Seconds(60));
  board.Shutdown();
  EXPECT_EQ(pending->calls(), 1);  // before Shutdown returned
  EXPECT_EQ(CodeOf(pending, absl::ZeroDuration()), absl::StatusCode::kCancelled);
  EXPECT_EQ(CodeOf(Await(board, "y", absl::Seconds(60)), absl::ZeroDuration()),
            absl::StatusCode::kCancelled);
  board.Deliver("z", absl::OkStatus());  // ignored
  EXPECT_EQ(board.early_outcomes(), 0u);
  board.Shutdown();  // idempotent
}

}  // namespace
}  // namespace transfer
}  // namespace ferry
