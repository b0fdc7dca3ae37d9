// The KV store library: put/get/exists/delete, chain prefixes, fingerprints, TTLs and per-object
// retention floors on a fake clock, capacity eviction that keeps what is read, restarts (floors
// included, and stores written before floors existed), corruption and torn segments served as
// misses, what opening skips counted by reason, logged and verified, puts of present keys (the
// same bytes or a conflict), a delete and a put of one key in one group, concurrent readers and
// writers, and writes lost by a simulated power cut.

#include "kvstore/kv_store.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_format.h"
#include "engine/common/fake_clock.h"
#include "engine/common/log.h"
#include "gtest/gtest.h"
#include "kvstore/fault_file_system.h"

namespace ferry {
namespace kv {
namespace {

namespace fs = std::filesystem;

Hash128 Key(uint64_t i) { return Xxh3Hash128("key" + std::to_string(i)); }
const Hash128 kModel = Xxh3Hash128("model A");
const Hash128 kOtherModel = Xxh3Hash128("model B");

// Bytes that depend on the key and the length only.
std::string Value(uint64_t i, size_t bytes) {
  std::string v(bytes, '\0');
  std::mt19937_64 rng(i * 7919 + bytes);
  for (size_t j = 0; j < bytes; j += 8) {
    const uint64_t r = rng();
    std::memcpy(&v[j], &r, std::min<size_t>(8, bytes - j));
  }
  return v;
}

ObjectMeta Meta(TrafficClass c = TrafficClass::kChat, uint32_t retention_floor_s = 0) {
  ObjectMeta m;
  m.fingerprint = kModel;
  m.layout_tag = 42;
  m.token_count = 64;
  m.traffic_class = c;
  m.retention_floor_s = retention_floor_s;
  return m;
}

// Captures the log records (their messages) while it lives.
class CapturedLog : public LogSink {
 public:
  CapturedLog() { SetLogSink(this); }
  ~CapturedLog() override { SetLogSink(nullptr); }
  void Send(const LogRecord& record) override {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(absl::StrCat(LogSeverityName(record.severity), " ", record.message));
  }
  // The lines that contain every one of `parts`.
  std::vector<std::string> With(const std::vector<std::string>& parts) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const std::string& line : lines_) {
      bool all = true;
      for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
      if (all) out.push_back(line);
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
};

std::array<int64_t, kNumRecoveryDrops> Drops(int64_t torn_tail, int64_t checksum, int64_t header) {
  std::array<int64_t, kNumRecoveryDrops> d = {};
  d[static_cast<int>(RecoveryDrop::kTornTail)] = torn_tail;
  d[static_cast<int>(RecoveryDrop::kChecksum)] = checksum;
  d[static_cast<int>(RecoveryDrop::kHeader)] = header;
  return d;
}

class KvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("kv_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    options_.segment_bytes = 1 << 20;
    options_.capacity_bytes = 64 << 20;
    options_.max_object_bytes = 512 << 10;
    options_.clock = &clock_;
  }
  std::unique_ptr<KvStore> OpenStore() {
    auto s = KvStore::Open(dir_.string(), options_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  void PutN(KvStore& store, uint64_t from, uint64_t to, size_t bytes,
            TrafficClass c = TrafficClass::kChat, uint32_t retention_floor_s = 0) {
    std::vector<std::string> values;
    std::vector<PutItem> items;
    for (uint64_t i = from; i < to; ++i) values.push_back(Value(i, bytes));
    for (uint64_t i = from; i < to; ++i) {
      items.push_back({Key(i), Meta(c, retention_floor_s), values[i - from]});
    }
    ASSERT_TRUE(store.Put(items).ok());
  }
  // Present by Exists, which (unlike Get) is not a use: it does not move the expiry.
  bool Present(KvStore& store, uint64_t i) { return store.Exists({Key(i)}, kModel).present[0]; }
  bool Has(KvStore& store, uint64_t i, size_t bytes) {
    auto r = store.Get({Key(i)}, kModel);
    if (!r[0].found) return false;
    EXPECT_EQ(r[0].value, Value(i, bytes)) << "object " << i << " came back different";
    return true;
  }

  fs::path dir_;
  FakeClock clock_;
  StoreOptions options_;
};

TEST_F(KvStoreTest, PutGetExistsDelete) {
  auto store = OpenStore();
  PutN(*store, 0, 10, 10000);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(Has(*store, i, 10000));
  auto got = store->Get({Key(3)}, kModel);
  EXPECT_EQ(got[0].meta.layout_tag, 42u);
  EXPECT_EQ(got[0].meta.token_count, 64u);
  EXPECT_EQ(got[0].created, clock_.Now());
  EXPECT_FALSE(store->Get({Key(99)}, kModel)[0].found);
  // Another model's fingerprint: a miss, counted.
  EXPECT_FALSE(store->Get({Key(3)}, kOtherModel)[0].found);
  EXPECT_EQ(store->Stats().fingerprint_mismatches, 1);
  EXPECT_EQ(store->Exists({Key(3)}, kOtherModel).prefix, 0);

  // A chain: keys 0..9 present, 10 absent, 11 present.
  PutN(*store, 11, 12, 100);
  auto e = store->Exists({Key(0), Key(1), Key(2), Key(10), Key(11)}, kModel);
  EXPECT_EQ(e.prefix, 3);
  EXPECT_EQ(e.present, std::vector<bool>({true, true, true, false, true}));

  EXPECT_EQ(*store->Delete({Key(1), Key(98)}), 1);
  EXPECT_FALSE(Has(*store, 1, 10000));
  EXPECT_EQ(store->Exists({Key(0), Key(1), Key(2)}, kModel).prefix, 1);
  // Empty values, and the same key twice in one batch.
  std::string empty;
  ASSERT_TRUE(store->Put({{Key(50), Meta(), empty}, {Key(50), Meta(), empty}}).ok());
  EXPECT_TRUE(Has(*store, 50, 0));
  // Too large: refused before anything is written.
  const std::string big(options_.max_object_bytes + 1, 'x');
  EXPECT_EQ(store->Put({{Key(60), Meta(), "ok"}, {Key(61), Meta(), big}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(store->Get({Key(60)}, kModel)[0].found);

  StoreStats s = store->Stats();
  EXPECT_EQ(s.objects, 11 - 1 + 1);
  EXPECT_EQ(s.classes[0].objects, s.objects);
  // The constant-time counters agree while nothing is past its TTL.
  const StoreStats c = store->Counters();
  EXPECT_EQ(c.objects, s.objects);
  EXPECT_EQ(c.value_bytes, s.value_bytes);
  for (int k = 0; k < kNumTrafficClasses; ++k) {
    EXPECT_EQ(c.classes[k].objects, s.classes[k].objects);
    EXPECT_EQ(c.classes[k].bytes, s.classes[k].bytes);
  }
}

TEST_F(KvStoreTest, OptionsAreCheckedAndADirectoryHasOneOwner) {
  StoreOptions bad = options_;
  bad.segment_bytes = 1000;
  EXPECT_EQ(KvStore::Open(dir_.string(), bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = options_;
  bad.capacity_bytes = 2 * options_.segment_bytes;
  EXPECT_FALSE(KvStore::Open(dir_.string(), bad).ok());
  bad = options_;
  bad.max_object_bytes = options_.segment_bytes;
  EXPECT_FALSE(KvStore::Open(dir_.string(), bad).ok());
  bad = options_;
  bad.ttl[1] = absl::ZeroDuration();
  EXPECT_FALSE(KvStore::Open(dir_.string(), bad).ok());
  // Missing parents are created.
  EXPECT_TRUE(KvStore::Open((dir_ / "a" / "b" / "c").string(), options_).ok());
  fs::remove_all(dir_);
  auto store = OpenStore();
  auto second = KvStore::Open(dir_.string(), options_);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
}

TEST_F(KvStoreTest, TtlPerTrafficClassFromLastUse) {
  auto store = OpenStore();
  PutN(*store, 0, 2, 5000, TrafficClass::kAgent);  // 3 days
  PutN(*store, 2, 4, 5000, TrafficClass::kChat);   // 7 days
  clock_.Advance(absl::Hours(48));
  EXPECT_TRUE(Has(*store, 0, 5000));  // read at day 2: agent object 0 lives until day 5
  clock_.Advance(absl::Hours(24) + absl::Seconds(1));
  EXPECT_FALSE(Has(*store, 1, 5000));  // day 3 + 1 s: never read since creation
  EXPECT_TRUE(Has(*store, 2, 5000));
  EXPECT_EQ(store->Exists({Key(0), Key(1), Key(2)}, kModel).present,
            std::vector<bool>({true, false, true}));
  clock_.Advance(absl::Hours(48));  // day 5 + 1 s
  EXPECT_FALSE(Has(*store, 0, 5000));
  EXPECT_TRUE(Has(*store, 3, 5000));
  clock_.Advance(absl::Hours(24 * 5 + 1));  // day 10 + 1 h: chat object 2, last read at day 3
  EXPECT_FALSE(Has(*store, 2, 5000));
  EXPECT_TRUE(Has(*store, 3, 5000));  // last read at day 5
  clock_.Advance(absl::Hours(24 * 7) + absl::Seconds(1));
  EXPECT_FALSE(Has(*store, 3, 5000));
  // Configurable, and expired objects leave the files at the next compaction.
  ASSERT_TRUE(store->Compact().ok());
  EXPECT_EQ(store->Stats().objects, 0);
  EXPECT_GE(store->Stats().expired, 4);
  store.reset();
  options_.ttl[static_cast<int>(TrafficClass::kChat)] = absl::Minutes(5);
  store = OpenStore();
  PutN(*store, 10, 11, 100, TrafficClass::kChat);
  clock_.Advance(absl::Minutes(6));
  EXPECT_FALSE(Has(*store, 10, 100));
}

TEST_F(KvStoreTest, ARetentionFloorOutlastsAShorterClassTtl) {
  options_.ttl[static_cast<int>(TrafficClass::kChat)] = absl::Minutes(10);
  auto store = OpenStore();
  PutN(*store, 0, 1, 5000, TrafficClass::kChat, 3600);  // "1h"
  PutN(*store, 1, 2, 5000, TrafficClass::kChat, 300);   // "5m": the class keeps it longer
  PutN(*store, 2, 3, 5000, TrafficClass::kChat, 0);     // the class alone, as before floors
  const ExistsResult e = store->Exists({Key(0), Key(1), Key(2), Key(3)}, kModel);
  EXPECT_EQ(e.present, std::vector<bool>({true, true, true, false}));
  EXPECT_EQ(e.retention_floor_s, std::vector<uint32_t>({3600, 300, 0, 0}));
  EXPECT_EQ(store->Get({Key(0)}, kModel)[0].meta.retention_floor_s, 3600u);  // a use, at 0
  // Counted by floor (the metric ferry_kvstore_objects_by_retention_floor).
  EXPECT_EQ(store->Counters().objects_by_floor, (std::array<int64_t, kFloorBuckets>{1, 1, 1, 0}));
  EXPECT_EQ(store->Stats().objects_by_floor, (std::array<int64_t, kFloorBuckets>{1, 1, 1, 0}));
  clock_.Advance(absl::Minutes(10) - absl::Seconds(1));
  EXPECT_TRUE(Present(*store, 1));
  EXPECT_TRUE(Present(*store, 2));
  clock_.Advance(absl::Seconds(2));  // 10 min + 1 s
  EXPECT_FALSE(Present(*store, 1));
  EXPECT_FALSE(Present(*store, 2));
  EXPECT_FALSE(Has(*store, 2, 5000));
  clock_.Advance(absl::Minutes(49));  // 59 min after its last use
  EXPECT_TRUE(Present(*store, 0));
  EXPECT_EQ(store->Stats().objects, 1);
  EXPECT_EQ(store->Stats().objects_by_floor, (std::array<int64_t, kFloorBuckets>{0, 0, 1, 0}));
  clock_.Advance(absl::Minutes(2));  // 61 min
  EXPECT_FALSE(Present(*store, 0));
  EXPECT_FALSE(Has(*store, 0, 5000));
  ASSERT_TRUE(store->Compact().ok());
  EXPECT_EQ(store->Stats().objects, 0);
}

TEST_F(KvStoreTest, ALongerClassTtlOutlastsTheFloor) {
  options_.ttl[static_cast<int>(TrafficClass::kBatch)] = absl::Hours(24);
  auto store = OpenStore();
  PutN(*store, 0, 1, 5000, TrafficClass::kBatch, 3600);
  clock_.Advance(absl::Hours(23));
  EXPECT_TRUE(Present(*store, 0));
  EXPECT_TRUE(Has(*store, 0, 5000));  // a use at 23 h: kept until 47 h
  clock_.Advance(absl::Hours(24) - absl::Seconds(1));
  EXPECT_TRUE(Present(*store, 0));
  clock_.Advance(absl::Seconds(2));
  EXPECT_FALSE(Present(*store, 0));
}

TEST_F(KvStoreTest, APutWithAHigherFloorExtendsAPresentObject) {
  options_.ttl[static_cast<int>(TrafficClass::kChat)] = absl::Minutes(10);
  options_.ttl[static_cast<int>(TrafficClass::kBatch)] = absl::Minutes(5);
  auto store = OpenStore();
  PutN(*store, 0, 1, 5000, TrafficClass::kChat, 300);
  EXPECT_EQ(store->Stats().puts, 1);
  clock_.Advance(absl::Minutes(8));
  // A lower or equal floor: the object is kept as it is (nothing written, its last use stays).
  PutN(*store, 0, 1, 5000, TrafficClass::kChat, 0);
  PutN(*store, 0, 1, 5000, TrafficClass::kChat, 300);
  EXPECT_EQ(store->Stats().puts, 1);
  // A higher one: written again (its last use now), keeping the longer-lived class (chat's
  // 10 min over batch's 5).
  PutN(*store, 0, 1, 5000, TrafficClass::kBatch, 3600);
  EXPECT_EQ(store->Stats().puts, 2);
  EXPECT_EQ(store->Exists({Key(0)}, kModel).retention_floor_s[0], 3600u);
  auto got = store->Get({Key(0)}, kModel);  // at the re-put's time: its last use stays
  ASSERT_TRUE(got[0].found);
  EXPECT_EQ(got[0].value, Value(0, 5000));
  EXPECT_EQ(got[0].meta.retention_floor_s, 3600u);
  EXPECT_EQ(got[0].meta.traffic_class, TrafficClass::kChat);
  EXPECT_EQ(store->Stats().objects, 1);
  clock_.Advance(absl::Minutes(59));  // 67 min after the first put, 59 after the re-put
  EXPECT_TRUE(Present(*store, 0));
  // The same key twice in one batch: the higher floor wins.
  const std::string v = Value(1, 100);
  ASSERT_TRUE(store
                  ->Put({{Key(1), Meta(TrafficClass::kChat, 0), v},
                         {Key(1), Meta(TrafficClass::kChat, 900), v}})
                  .ok());
  EXPECT_EQ(store->Exists({Key(1)}, kModel).retention_floor_s[0], 900u);
  // Both outlive a restart (the newest record of each key wins).
  store.reset();
  store = OpenStore();
  const ExistsResult e = store->Exists({Key(0), Key(1)}, kModel);
  EXPECT_EQ(e.retention_floor_s, std::vector<uint32_t>({3600, 900}));
  clock_.Advance(absl::Seconds(30));
  EXPECT_TRUE(Present(*store, 0));
  clock_.Advance(absl::Minutes(1));  // 60.5 min after the re-put
  EXPECT_FALSE(Present(*store, 0));
  clock_.Advance(absl::Minutes(12));  // 13.5 min after key 1's put: its floor, not chat's 10 min
  EXPECT_TRUE(Present(*store, 1));
  clock_.Advance(absl::Minutes(2));
  EXPECT_FALSE(Present(*store, 1));
}

TEST_F(KvStoreTest, FloorsSurviveARestartFromSealedAndOpenSegments) {
  options_.ttl[static_cast<int>(TrafficClass::kChat)] = absl::Minutes(10);
  const size_t bytes = 200 << 10;  // 5 a segment
  {
    auto store = OpenStore();
    PutN(*store, 0, 6, bytes, TrafficClass::kChat, 3600);  // 0..4 sealed, 5 in the open one
    PutN(*store, 6, 12, bytes, TrafficClass::kChat, 0);    // 6..9 sealed, 10 and 11 open
    EXPECT_GE(store->Stats().segments, 3);
  }
  auto check = [&](const char* when) {
    SCOPED_TRACE(when);
    auto store = OpenStore();
    const StoreStats s = store->Stats();
    EXPECT_GE(s.segments_from_footer, 2);
    EXPECT_EQ(s.segments_scanned, 1);  // only the segment that was open
    std::vector<Hash128> keys;
    for (uint64_t i = 0; i < 12; ++i) keys.push_back(Key(i));
    const ExistsResult e = store->Exists(keys, kModel);
    for (uint64_t i = 0; i < 12; ++i) {
      EXPECT_TRUE(e.present[i]) << i;
      EXPECT_EQ(e.retention_floor_s[i], i < 6 ? 3600u : 0u) << i;
    }
  };
  check("reopened");
  {
    // Compaction rewrites records as they are: their floors move with them.
    auto store = OpenStore();
    ASSERT_TRUE(store->Delete({Key(1), Key(7)}).ok());
    ASSERT_TRUE(store->Compact().ok());
    PutN(*store, 1, 2, bytes, TrafficClass::kChat, 3600);
    PutN(*store, 7, 8, bytes, TrafficClass::kChat, 0);
  }
  check("compacted and reopened");
  clock_.Advance(absl::Minutes(30));
  auto store = OpenStore();
  for (uint64_t i = 0; i < 12; ++i) EXPECT_EQ(Present(*store, i), i < 6) << i;
}

// The fuzz seeds (kvstore/testdata/make_fuzz_corpus.py), written relative to this time.
constexpr int64_t kSeedNowUs = 1'750'000'000'000'000;

void CopyFile(const std::string& from, const fs::path& to) {
  fs::create_directories(to.parent_path());
  fs::copy_file(from, to, fs::copy_options::overwrite_existing);
}

TEST_F(KvStoreTest, AStoreWrittenBeforeFloorsOpensWithFloorZero) {
  // A sealed segment with a version 1 footer and records without floors, as written before them.
  clock_.SetWallTime(absl::FromUnixMicros(kSeedNowUs));
  CopyFile("kvstore/testdata/fuzz_corpus/sealed_v1.seg", dir_ / SegmentFileName(1));
  {
    auto store = OpenStore();
    const StoreStats s = store->Stats();
    EXPECT_EQ(s.segments_from_footer, 1);
    EXPECT_EQ(s.segments_scanned, 0);
    EXPECT_EQ(s.objects, 3);
    const std::vector<Hash128> keys = {Xxh3Hash128("sealed 1"), Xxh3Hash128("sealed 2"),
                                       Xxh3Hash128("sealed 3")};
    const ExistsResult e = store->Exists(keys, kModel);
    EXPECT_EQ(e.present, std::vector<bool>({true, true, true}));
    EXPECT_EQ(e.retention_floor_s, std::vector<uint32_t>({0, 0, 0}));
    auto got = store->Get(keys, kModel);
    for (const GetResult& r : got) EXPECT_TRUE(r.found);
    EXPECT_EQ(got[1].meta.traffic_class, TrafficClass::kAgent);
    // New objects next to the old ones, with floors, after a restart.
    PutN(*store, 0, 1, 1000, TrafficClass::kChat, 300);
  }
  auto store = OpenStore();
  EXPECT_EQ(store->Stats().objects, 4);
  EXPECT_EQ(store->Exists({Key(0)}, kModel).retention_floor_s[0], 300u);
  EXPECT_TRUE(store->Get({Xxh3Hash128("sealed 3")}, kModel)[0].found);
  EXPECT_EQ(store->Verify().corrupt, 0);
}

TEST_F(KvStoreTest, ASealedSegmentWithFloorsOpens) {
  clock_.SetWallTime(absl::FromUnixMicros(kSeedNowUs));
  CopyFile("kvstore/testdata/fuzz_corpus/sealed.seg", dir_ / SegmentFileName(1));
  auto store = OpenStore();
  EXPECT_EQ(store->Stats().segments_from_footer, 1);
  const ExistsResult e = store->Exists(
      {Xxh3Hash128("sealed 1"), Xxh3Hash128("sealed 2"), Xxh3Hash128("sealed 3")}, kModel);
  EXPECT_EQ(e.present, std::vector<bool>({true, true, true}));
  EXPECT_EQ(e.retention_floor_s, std::vector<uint32_t>({0, 3600, 0}));
}

TEST_F(KvStoreTest, CapacityEvictsTheColdestAndKeepsWhatIsRead) {
  options_.capacity_bytes = 4 << 20;  // 4 segments of 1 MiB
  auto store = OpenStore();
  const size_t bytes = 100 << 10;
  PutN(*store, 0, 10, bytes);
  // 0..3 are read now and then while 200 more objects (20 MiB) arrive.
  for (uint64_t i = 10; i < 210; ++i) {
    clock_.Advance(absl::Milliseconds(10));
    PutN(*store, i, i + 1, bytes);
    if (i % 5 == 0) {
      clock_.Advance(absl::Milliseconds(10));
      for (uint64_t h = 0; h < 4; ++h)
        ASSERT_TRUE(Has(*store, h, bytes)) << "hot " << h << " at " << i;
    }
    ASSERT_LE(store->Stats().file_bytes, options_.capacity_bytes + options_.segment_bytes);
  }
  for (uint64_t h = 0; h < 4; ++h) EXPECT_TRUE(Has(*store, h, bytes));
  for (uint64_t c = 4; c < 10; ++c) EXPECT_FALSE(Has(*store, c, bytes)) << "cold " << c;
  for (uint64_t n = 200; n < 210; ++n) EXPECT_TRUE(Has(*store, n, bytes)) << "newest " << n;
  const StoreStats s = store->Stats();
  EXPECT_GT(s.evicted, 150);
  EXPECT_GT(s.rewritten, 0);
  EXPECT_LE(s.file_bytes, options_.capacity_bytes);
  EXPECT_LE(s.segments, 5);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.path().extension() == ".seg";
  EXPECT_EQ(files, s.segments);
}

TEST_F(KvStoreTest, ARestartReturnsIdenticalResults) {
  std::vector<Hash128> keys;
  for (uint64_t i = 0; i < 60; ++i) keys.push_back(Key(i));
  std::vector<GetResult> before;
  ExistsResult exists_before;
  {
    auto store = OpenStore();
    for (uint64_t i = 0; i < 50; i += 10) {
      PutN(*store, i, i + 10, 30000 + i * 1000,
           i % 20 ? TrafficClass::kChat : TrafficClass::kAgent);
    }
    ASSERT_TRUE(store->Delete({Key(7), Key(33)}).ok());
    clock_.Advance(absl::Seconds(5));
    before = store->Get(keys, kModel);
    exists_before = store->Exists(keys, kModel);
    EXPECT_GE(store->Stats().segments, 2);
  }
  for (int round = 0; round < 2; ++round) {
    auto store = OpenStore();
    const StoreStats s = store->Stats();
    EXPECT_EQ(s.open_objects, 48);
    EXPECT_GE(s.segments_from_footer, 1);
    EXPECT_EQ(s.segments_scanned, 1);  // only the segment that was open
    auto after = store->Get(keys, kModel);
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(after[i].found, before[i].found) << i;
      EXPECT_EQ(after[i].value, before[i].value) << i;
      EXPECT_EQ(after[i].created, before[i].created) << i;
      EXPECT_EQ(after[i].meta.traffic_class, before[i].meta.traffic_class) << i;
    }
    const ExistsResult e = store->Exists(keys, kModel);
    EXPECT_EQ(e.prefix, exists_before.prefix);
    EXPECT_EQ(e.present, exists_before.present);
  }
  // Writing continues after the restart, and deletes stay deleted through compaction.
  auto store = OpenStore();
  PutN(*store, 100, 103, 1000);
  ASSERT_TRUE(store->Compact().ok());
  store.reset();
  store = OpenStore();
  EXPECT_TRUE(Has(*store, 101, 1000));
  EXPECT_FALSE(Has(*store, 7, 30000 + 0 * 1000));
  EXPECT_EQ(store->Stats().objects, 51);
}

// Offsets of every record in a segment file, found from its header checksums.
std::vector<std::pair<uint64_t, RecordHeader>> Records(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::pair<uint64_t, RecordHeader>> out;
  for (uint64_t pos = kSegmentHeaderBytes; pos + kRecordHeaderBytes <= bytes.size();
       pos += kDirectIoAlignment) {
    auto h = DecodeRecordHeader(absl::string_view(bytes).substr(pos, kRecordHeaderBytes));
    if (h.ok()) out.emplace_back(pos, *h);
  }
  return out;
}

void FlipByte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

std::vector<fs::path> SegmentFiles(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".seg") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST_F(KvStoreTest, AFlippedByteIsAMissAndVerifyReportsIt) {
  const size_t bytes = 200 << 10;
  {
    auto store = OpenStore();
    PutN(*store, 0, 12, bytes);  // two sealed segments and an open one
  }
  const auto files = SegmentFiles(dir_);
  ASSERT_GE(files.size(), 3u);
  const auto sealed = Records(files[0]);
  const auto open = Records(files.back());
  ASSERT_GE(sealed.size(), 3u);
  ASSERT_GE(open.size(), 1u);
  // A value byte of two objects in a sealed segment, a header byte of a third; and the footer's
  // last byte (its trailer checksum) of the second segment: that segment is scanned instead.
  FlipByte(files[0], sealed[0].first + kRecordHeaderBytes + 1000);
  FlipByte(files[0], sealed[1].first + kRecordHeaderBytes + bytes - 1);
  FlipByte(files[0], sealed[2].first + 20);
  FlipByte(files[1], fs::file_size(files[1]) - 1);
  // A value byte in the segment that was open: the scan at start-up drops the record.
  FlipByte(files.back(), open[0].first + kRecordHeaderBytes + 5);

  auto store = OpenStore();
  StoreStats s = store->Stats();
  EXPECT_EQ(s.segments_scanned, 2);
  // Only the open segment's record is skipped at opening (the second segment's footer starts
  // intact: not records); the sealed one's are found by reading.
  EXPECT_EQ(s.recovery_dropped, Drops(0, 1, 0));
  auto key_index = [&](const Hash128& key) {
    for (uint64_t i = 0; i < 12; ++i) {
      if (Key(i) == key) return i;
    }
    return uint64_t{999};
  };
  const uint64_t a = key_index(sealed[0].second.key), b = key_index(sealed[1].second.key);
  const uint64_t c = key_index(sealed[2].second.key), d = key_index(open[0].second.key);
  EXPECT_FALSE(Has(*store, a, bytes));  // found by a read
  EXPECT_EQ(store->Stats().corrupt_reads, 1);
  const VerifyReport report = store->Verify();  // finds b and c; d never made the index
  EXPECT_EQ(report.corrupt, 2);
  ASSERT_FALSE(report.problems.empty());
  bool named = false;
  for (const std::string& p : report.problems) named |= p.find(Key(b).ToHex()) != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_FALSE(Has(*store, b, bytes));
  EXPECT_FALSE(Has(*store, c, bytes));
  EXPECT_FALSE(Has(*store, d, bytes));
  int served = 0;
  for (uint64_t i = 0; i < 12; ++i) served += Has(*store, i, bytes);
  EXPECT_EQ(served, 12 - 4);
  EXPECT_EQ(store->Verify().corrupt, 0);
}

TEST_F(KvStoreTest, ATruncatedSegmentLosesOnlyWhatWasCut) {
  const size_t bytes = 150 << 10;
  {
    auto store = OpenStore();
    PutN(*store, 0, 10, bytes);  // a sealed segment of 6 objects, 4 in the open one
  }
  auto files = SegmentFiles(dir_);
  ASSERT_EQ(files.size(), 2u);
  // The open segment cut in the middle of its last record (not on a 4 KiB boundary).
  fs::resize_file(files[1], fs::file_size(files[1]) - 70000);
  // The sealed one cut inside its third record: footer gone, two records left.
  const auto sealed = Records(files[0]);
  fs::resize_file(files[0], sealed[2].first + 5000);
  {
    auto store = OpenStore();
    const StoreStats s = store->Stats();
    EXPECT_GT(s.torn_bytes_dropped, 0);
    EXPECT_EQ(s.segments_scanned, 2);
    // The open segment's last record is a torn tail; the sealed one's third, cut short, is lost
    // data (counted as a checksum failure).
    EXPECT_EQ(s.recovery_dropped, Drops(1, 1, 0));
    EXPECT_EQ(s.objects, 2 + 3);
    int served = 0;
    for (uint64_t i = 0; i < 10; ++i) served += Has(*store, i, bytes);
    EXPECT_EQ(served, 5);
    PutN(*store, 20, 22, bytes);  // appends after the cut
  }
  auto store = OpenStore();
  EXPECT_EQ(store->Stats().objects, 7);
  EXPECT_EQ(store->Stats().torn_bytes_dropped, 0);
  EXPECT_EQ(store->Stats().recovery_dropped, Drops(0, 1, 0));  // the sealed one is as it was
  EXPECT_TRUE(Has(*store, 21, bytes));
  EXPECT_EQ(store->Verify().corrupt, 0);
}

TEST_F(KvStoreTest, WhatOpeningSkipsInTheOpenSegmentIsCountedLoggedAndVerified) {
  const size_t bytes = 50 << 10;
  {
    auto store = OpenStore();
    PutN(*store, 0, 6, bytes);  // all in the open segment
  }
  const auto files = SegmentFiles(dir_);
  ASSERT_EQ(files.size(), 1u);
  const std::string name = files[0].filename().string();
  const auto records = Records(files[0]);
  ASSERT_EQ(records.size(), 6u);
  auto key_index = [&](size_t r) {
    for (uint64_t i = 0; i < 6; ++i) {
      if (Key(i) == records[r].second.key) return i;
    }
    return uint64_t{999};
  };
  // Record 1: a value byte (checksum); record 3: a header byte (header); record 5 cut in the
  // middle (the torn tail). Records 0, 2 and 4 are intact, two of them after damage.
  FlipByte(files[0], records[1].first + kRecordHeaderBytes + 777);
  FlipByte(files[0], records[3].first + 30);
  fs::resize_file(files[0], records[5].first + 9000);

  CapturedLog log;
  {
    auto store = OpenStore();
    const StoreStats s = store->Stats();
    EXPECT_EQ(s.recovery_dropped, Drops(1, 1, 1));
    EXPECT_EQ(s.torn_bytes_dropped, 9000);
    EXPECT_EQ(s.objects, 3);
    for (size_t r : {0, 2, 4}) EXPECT_TRUE(Has(*store, key_index(r), bytes)) << r;
    for (size_t r : {1, 3, 5}) EXPECT_FALSE(Has(*store, key_index(r), bytes)) << r;
    // One WARNING per reason, naming the directory, the segment file, the offset and the reason.
    const std::string dir = dir_.string();
    EXPECT_EQ(log.With({"WARNING", dir, name, absl::StrCat(" at ", records[1].first, ": checksum"),
                        Key(key_index(1)).ToHex(), "value checksum mismatch"})
                  .size(),
              1u);
    EXPECT_EQ(log.With({"WARNING", dir, name, absl::StrCat(" at ", records[3].first, ": header"),
                        "1 record dropped"})
                  .size(),
              1u);
    EXPECT_EQ(log.With({"WARNING", dir, name, absl::StrCat(" at ", records[5].first, ": torn_tail"),
                        "9000 bytes cut"})
                  .size(),
              1u);
    // Verify reports them: the counts, and a problem line each; nothing in the index is corrupt.
    const VerifyReport report = store->Verify();
    EXPECT_EQ(report.corrupt, 0);
    EXPECT_EQ(report.objects_checked, 3);
    EXPECT_EQ(report.recovery_dropped, Drops(1, 1, 1));
    ASSERT_EQ(report.problems.size(), 3u);
    EXPECT_NE(report.problems[0].find(absl::StrCat(name, " at ", records[1].first, ": checksum")),
              std::string::npos)
        << report.problems[0];
    EXPECT_NE(report.problems[1].find(absl::StrCat(name, " at ", records[3].first, ": header")),
              std::string::npos)
        << report.problems[1];
    EXPECT_NE(report.problems[2].find(absl::StrCat(name, " at ", records[5].first, ": torn_tail")),
              std::string::npos)
        << report.problems[2];
    PutN(*store, 10, 11, bytes);  // appended where the tail was cut
  }
  // The damaged records are still in the segment (skipped again); the tail is gone.
  auto store = OpenStore();
  EXPECT_EQ(store->Stats().recovery_dropped, Drops(0, 1, 1));
  EXPECT_EQ(store->Stats().torn_bytes_dropped, 0);
  EXPECT_TRUE(Has(*store, 10, bytes));
  EXPECT_TRUE(Has(*store, key_index(4), bytes));
}

TEST_F(KvStoreTest, AFooterCutShortIsNotARecord) {
  const size_t bytes = 200 << 10;  // 5 a segment
  {
    auto store = OpenStore();
    PutN(*store, 0, 5, bytes);
  }
  // A crash while sealing: records durable, the footer half written, no next segment yet.
  {
    auto store = OpenStore();
    PutN(*store, 5, 6, bytes);  // seals the first segment
  }
  auto files = SegmentFiles(dir_);
  ASSERT_EQ(files.size(), 2u);
  fs::remove(files[1]);
  const auto records = Records(files[0]);
  ASSERT_EQ(records.size(), 5u);
  const uint64_t footer = records.back().first + records.back().second.record_bytes();
  ASSERT_GT(fs::file_size(files[0]), footer + 300);
  fs::resize_file(files[0], footer + 300);
  auto store = OpenStore();
  const StoreStats s = store->Stats();
  EXPECT_EQ(s.recovery_dropped, Drops(0, 0, 0));
  EXPECT_EQ(s.torn_bytes_dropped, 300);
  EXPECT_EQ(s.objects, 5);
  const VerifyReport report = store->Verify();
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("a footer cut short"), std::string::npos) << report.problems[0];
}

TEST_F(KvStoreTest, APutOfAPresentKeyKeepsTheStoredBytesAndReportsAConflict) {
  options_.segment_bytes = 1 << 20;
  const std::string a = Value(1, 3000), b = Value(2, 3000);
  const std::string a_sum = absl::StrFormat("%016x", Checksum(a));
  const std::string b_sum = absl::StrFormat("%016x", Checksum(b));
  CapturedLog log;
  auto store = OpenStore();
  PutResult r;
  ASSERT_TRUE(store->Put({{Key(1), Meta(), a}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kWritten}));
  EXPECT_EQ(r.already_present, 0);
  // The same bytes: present, nothing counted as a conflict.
  ASSERT_TRUE(store->Put({{Key(1), Meta(), a}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kPresent}));
  EXPECT_EQ(r.already_present, 1);
  EXPECT_EQ(r.conflicts, 0);
  EXPECT_EQ(store->Stats().key_conflicts, 0);
  EXPECT_TRUE(log.With({"other bytes"}).empty());
  // Other bytes: present, a conflict, counted and logged; the first bytes stay.
  ASSERT_TRUE(store->Put({{Key(1), Meta(), b}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kConflict}));
  EXPECT_EQ(r.already_present, 1);
  EXPECT_EQ(r.conflicts, 1);
  EXPECT_EQ(log.With({"WARNING", Key(1).ToHex(), a_sum, b_sum, "other bytes"}).size(), 1u);
  EXPECT_TRUE(Has(*store, 1, 3000));
  // Not even a longer floor is taken with other bytes; with the same bytes it is.
  ASSERT_TRUE(store->Put({{Key(1), Meta(TrafficClass::kChat, 900), b}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kConflict}));
  EXPECT_EQ(store->Exists({Key(1)}, kModel).retention_floor_s[0], 0u);
  ASSERT_TRUE(store->Put({{Key(1), Meta(TrafficClass::kChat, 900), a}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kFloorExtended}));
  EXPECT_EQ(store->Exists({Key(1)}, kModel).retention_floor_s[0], 900u);
  // One key twice in one call: the second is compared with the first.
  ASSERT_TRUE(store->Put({{Key(2), Meta(), b}, {Key(2), Meta(), a}, {Key(2), Meta(), b}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>(
                            {PutOutcome::kWritten, PutOutcome::kConflict, PutOutcome::kPresent}));
  EXPECT_EQ(r.already_present, 2);
  EXPECT_EQ(r.conflicts, 1);
  EXPECT_TRUE(Has(*store, 2, 3000));
  StoreStats s = store->Stats();
  EXPECT_EQ(s.key_conflicts, 3);
  EXPECT_EQ(s.already_present, 6);
  EXPECT_EQ(s.puts, 3);  // key 1, its longer floor, key 2

  // After a restart from a sealed segment's footer (no value checksums in it), conflicts are
  // still found: from the record's header, not its value.
  PutN(*store, 100, 130, 60 << 10);  // seals the segment that holds keys 1 and 2
  store.reset();
  store = OpenStore();
  ASSERT_GE(store->Stats().segments_from_footer, 1);
  ASSERT_TRUE(store->Put({{Key(2), Meta(), a}, {Key(1), Meta(), a}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kConflict, PutOutcome::kPresent}));
  EXPECT_EQ(store->Stats().key_conflicts, 1);
  EXPECT_TRUE(Has(*store, 1, 3000));
  EXPECT_TRUE(Has(*store, 2, 3000));
  EXPECT_EQ(store->Stats().corrupt_reads, 0);
}

TEST_F(KvStoreTest, APutOverADamagedRecordOfAFooterWritesItAgain) {
  const size_t bytes = 200 << 10;  // 5 a segment
  {
    auto store = OpenStore();
    PutN(*store, 0, 8, bytes);
  }
  const auto files = SegmentFiles(dir_);
  const auto sealed = Records(files[0]);
  ASSERT_EQ(sealed.size(), 5u);
  uint64_t damaged = 999;
  for (uint64_t i = 0; i < 8; ++i) {
    if (Key(i) == sealed[2].second.key) damaged = i;
  }
  FlipByte(files[0], sealed[2].first + 40);  // its header
  auto store = OpenStore();
  EXPECT_TRUE(Present(*store, damaged));  // by the footer
  PutResult r;
  const std::string v = Value(damaged, bytes);
  ASSERT_TRUE(store->Put({{Key(damaged), Meta(), v}}, &r).ok());
  EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kWritten}));
  EXPECT_EQ(store->Stats().corrupt_reads, 1);
  EXPECT_TRUE(Has(*store, damaged, bytes));
}

// A file system whose Sync waits while the gate is closed: holds the writer inside a group
// commit, so that what is submitted meanwhile forms the next group.
class GateFileSystem : public FileSystem {
 public:
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = false;
    }
    cv_.notify_all();
  }
  // Waits until a Sync waits at the closed gate.
  void AwaitWaiter() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return waiting_ > 0; });
  }

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path, OpenMode mode,
                                             bool direct) override {
    auto file = PosixFileSystem().Open(path, mode, direct);
    if (!file.ok()) return file.status();
    return std::unique_ptr<File>(new GateFile(this, std::move(*file)));
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    return PosixFileSystem().List(dir);
  }
  absl::Status Remove(const std::string& path) override { return PosixFileSystem().Remove(path); }
  absl::Status CreateDir(const std::string& dir) override {
    return PosixFileSystem().CreateDir(dir);
  }
  absl::Status SyncDir(const std::string& dir) override { return PosixFileSystem().SyncDir(dir); }
  absl::StatusOr<std::unique_ptr<File>> Lock(const std::string& path) override {
    return PosixFileSystem().Lock(path);
  }

 private:
  class GateFile : public File {
   public:
    GateFile(GateFileSystem* fs, std::unique_ptr<File> base) : fs_(fs), base_(std::move(base)) {}
    absl::Status Write(uint64_t offset, const void* data, size_t n) override {
      return base_->Write(offset, data, n);
    }
    absl::Status WriteV(uint64_t offset, absl::Span<const iovec> buffers) override {
      return base_->WriteV(offset, buffers);
    }
    absl::StatusOr<size_t> Read(uint64_t offset, void* data, size_t n) const override {
      return base_->Read(offset, data, n);
    }
    absl::Status Sync() override {
      {
        std::unique_lock<std::mutex> lock(fs_->mu_);
        ++fs_->waiting_;
        fs_->cv_.notify_all();
        fs_->cv_.wait(lock, [&] { return !fs_->closed_; });
        --fs_->waiting_;
      }
      return base_->Sync();
    }
    absl::Status Truncate(uint64_t size) override { return base_->Truncate(size); }
    absl::StatusOr<uint64_t> Size() const override { return base_->Size(); }
    bool direct() const override { return base_->direct(); }

   private:
    GateFileSystem* const fs_;
    std::unique_ptr<File> base_;
  };

  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  int waiting_ = 0;
};

TEST_F(KvStoreTest, ADeleteAndThenAPutOfOneKeyInOneGroupKeepThePut) {
  GateFileSystem gate;
  options_.fs = &gate;
  auto store = OpenStore();
  // A delete of keys k and m, and a put of both (k as it is, m with a longer floor), submitted
  // while the writer is held in another group so that they form one group. Whichever came first,
  // the end must be what that order means: the put first, both deleted; the delete first, both
  // put again (a put of a key deleted earlier in its group is not "present"). m tells the order:
  // it is written either way (its floor is longer), and survives only after the delete. The
  // pauses only make the interesting order likely; neither order fails.
  int delete_first = 0;
  for (uint64_t attempt = 0; attempt < 5; ++attempt) {
    const uint64_t k = 10 + 2 * attempt, m = k + 1;
    const std::string vk = Value(k, 1000), vm = Value(m, 1000);
    ASSERT_TRUE(store->Put({{Key(k), Meta(), vk}, {Key(m), Meta(), vm}}).ok());
    gate.Close();
    std::thread hold([&] { EXPECT_TRUE(store->Put({{Key(1000 + attempt), Meta(), vk}}).ok()); });
    gate.AwaitWaiter();
    const int64_t groups = store->Stats().group_commits;
    std::thread del([&] { EXPECT_EQ(*store->Delete({Key(k), Key(m)}), 2); });
    // Inherent: only biases the order toward delete-then-put (either order passes; see above).
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * (attempt + 1)));
    PutResult r;
    std::thread put([&] {
      EXPECT_TRUE(
          store->Put({{Key(k), Meta(), vk}, {Key(m), Meta(TrafficClass::kChat, 900), vm}}, &r)
              .ok());
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * (attempt + 1)));
    gate.Open();
    hold.join();
    del.join();
    put.join();
    const bool one_group = store->Stats().group_commits == groups + 2;
    if (Has(*store, m, 1000)) {
      delete_first += one_group;
      EXPECT_TRUE(Has(*store, k, 1000)) << "attempt " << attempt << ": the put of k was lost";
      EXPECT_EQ(r.outcomes, std::vector<PutOutcome>({PutOutcome::kWritten, PutOutcome::kWritten}));
    } else {
      EXPECT_FALSE(Has(*store, k, 1000)) << attempt;
    }
  }
  std::printf("the delete and then the put formed one group in %d of 5 attempts\n", delete_first);
}

TEST_F(KvStoreTest, ConcurrentReadersAndWriters) {
  options_.capacity_bytes = 256 << 20;
  auto store = OpenStore();
  constexpr int kWriters = 4, kReaders = 4, kPerWriter = 150;
  std::atomic<uint64_t> written[kWriters];
  for (auto& w : written) w = 0;
  std::atomic<int64_t> reads{0}, bad{0};
  std::atomic<bool> done{false};
  auto size_of = [](uint64_t i) { return 1000 + (i * 7919) % 60000; };
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      for (uint64_t n = 0; n < kPerWriter; ++n) {
        const uint64_t i = n * kWriters + w;
        const std::string v = Value(i, size_of(i));
        if (!store->Put({{Key(i), Meta(), v}}).ok()) ++bad;
        written[w] = n + 1;
      }
    });
  }
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&, r] {
      std::mt19937 rng(r);
      while (!done) {
        const int w = static_cast<int>(rng() % kWriters);
        const uint64_t have = written[w];
        if (have == 0) continue;
        const uint64_t i = (rng() % have) * kWriters + w;
        auto got = store->Get({Key(i)}, kModel);
        if (!got[0].found || got[0].value != Value(i, size_of(i))) ++bad;
        store->Exists({Key(i), Key(i + 1)}, kModel);
        ++reads;
      }
    });
  }
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  done = true;
  for (size_t t = kWriters; t < threads.size(); ++t) threads[t].join();
  EXPECT_EQ(bad, 0);
  EXPECT_GT(reads, 100);
  const StoreStats s = store->Stats();
  EXPECT_EQ(s.objects, kWriters * kPerWriter);
  EXPECT_LT(s.group_commits, kWriters * kPerWriter);  // puts shared fsyncs
}

TEST_F(KvStoreTest, NothingGrowsWithoutBoundUnderChurn) {
  options_.capacity_bytes = 4 << 20;
  options_.ttl[0] = absl::Minutes(30);
  auto store = OpenStore();
  // Puts, deletes, re-puts and expiries, 40 MiB in all through a 4 MiB store.
  for (uint64_t round = 0; round < 40; ++round) {
    PutN(*store, round * 10, round * 10 + 10, 100 << 10);
    std::vector<Hash128> gone;
    for (uint64_t i = round * 10; i < round * 10 + 5; ++i) gone.push_back(Key(i));
    ASSERT_TRUE(store->Delete(gone).ok());
    PutN(*store, round * 10, round * 10 + 2, 100 << 10);
    clock_.Advance(absl::Minutes(7));
    const StoreStats s = store->Stats();
    ASSERT_LE(s.file_bytes, options_.capacity_bytes + options_.segment_bytes) << round;
    ASSERT_LE(s.segments, 6) << round;
    ASSERT_LE(s.objects, 40) << round;
  }
  ASSERT_TRUE(store->Compact().ok());
  EXPECT_LE(store->Stats().file_bytes, options_.capacity_bytes);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    ++files;
    EXPECT_TRUE(e.path().extension() == ".seg" || e.path().filename() == "LOCK") << e.path();
  }
  EXPECT_LE(files, 7);
}

TEST_F(KvStoreTest, APowerCutLosesNothingAcknowledged) {
  // Every byte not fsynced is dropped at the cut (FaultFileSystem); acknowledged puts and
  // deletes survive, and nothing unacknowledged comes back corrupt.
  for (int round = 0; round < 5; ++round) {
    FaultFileSystem fault(&PosixFileSystem());
    options_.fs = &fault;
    std::vector<uint64_t> acked;
    std::mutex mu;
    {
      auto store = OpenStore();
      std::vector<std::thread> writers;
      std::atomic<bool> stop{false};
      for (int w = 0; w < 3; ++w) {
        writers.emplace_back([&, w] {
          for (uint64_t n = 0; !stop; ++n) {
            const uint64_t i = round * 100000 + n * 3 + w;
            const std::string v = Value(i, 20000 + i % 30000);
            if (!store->Put({{Key(i), Meta(), v}}).ok()) return;
            std::lock_guard<std::mutex> lock(mu);
            acked.push_back(i);
          }
        });
      }
      ::usleep(20000 + round * 15000);
      EXPECT_GE(fault.Crash(), 0);
      stop = true;
      for (auto& t : writers) t.join();
    }
    options_.fs = nullptr;
    auto store = OpenStore();
    for (uint64_t i : acked) ASSERT_TRUE(Has(*store, i, 20000 + i % 30000)) << "lost " << i;
    EXPECT_EQ(store->Verify().corrupt, 0);
  }
}
}  // namespace
}  // namespace kv
}  // namespace ferry
