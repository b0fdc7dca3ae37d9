// StoreWriter and StoreReader against an in-memory KvClient (the store's seam) and a real engine
// on a small synthetic model. Writer: blocks reach the store with the model's fingerprint, the
// pool's layout tag, their token count, class and retention floor and their bytes; hashes
// written or present are not written again unless a higher floor is wanted than the one known
// (then they are, counted "extended"); a full queue drops (no reference kept) and never blocks
// the caller; every reference goes back. Reader: a cold engine imports the stored run and answers
// exactly as the engine that computed it; the run ends at the first block missing or of another
// layout, and the blocks after it go back to the pool; a prefix the engine's memory holds is not
// read; a store that is down is a miss; a full queue skips the read; with the simulated engine's
// timing a read lasts at least its modeled time. With the worker's KV transport each Get carries a
// descriptor of exactly the fresh blocks and the read counts as by transport; a node that fails
// during such a read is a miss whose blocks stay out of the pool until the quarantine ends.

#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/block_hash.h"
#include "engine/common/fake_clock.h"
#include "engine/model/sim_timing.h"
#include "engine/model/synthetic_model.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "services/transfer/kv_transport.h"
#include "services/worker/store_reader.h"
#include "services/worker/store_writer.h"

namespace ferry {
namespace {

// The store in memory, with knobs: down (every call a miss or a failure), a gate that holds
// Puts, and counters.
class FakeKvClient final : public kv::KvClient {
 public:
  struct Object {
    kv::ObjectMeta meta;
    std::string value;
  };

  int64_t Put(absl::Span<const kv::ClientObject> objects) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++puts_;
    cv_.notify_all();  // for WaitForPuts
    cv_.wait(lock, [this] { return !held_; });
    if (down_) return 0;
    for (const kv::ClientObject& o : objects) {
      objects_[o.key] = Object{o.meta, std::string(o.value)};
    }
    return static_cast<int64_t>(objects.size());
  }
  std::vector<kv::ClientGetResult> Get(absl::Span<const Hash128> keys,
                                       const Hash128& fingerprint) override {
    std::vector<kv::ClientGetResult> out(keys.size());
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = objects_.find(keys[i]);
      if (down_ || it == objects_.end() || it->second.meta.fingerprint != fingerprint) continue;
      out[i] = {true, it->second.meta, it->second.value};
    }
    return out;
  }
  std::vector<kv::GetIntoResult> GetInto(absl::Span<const Hash128> keys, const Hash128& fingerprint,
                                         const kv::GetIntoDestination& destination) override {
    std::vector<kv::GetIntoResult> out(keys.size());
    std::lock_guard<std::mutex> lock(mu_);
    ++gets_;
    // A descriptor must be exactly the spans (as the real client checks); then the values come
    // "by the node's transport", or the node fails part way with its puts unsettled.
    const bool described = destination.descriptor.has_value();
    if (described) {
      ++described_gets_;
      const transfer::PeerDescriptor& d = *destination.descriptor;
      bool exact = d.block_slices.size() == keys.size() && d.regions.size() == 1;
      for (size_t i = 0; exact && i < keys.size(); ++i) {
        exact = d.regions[0].address + d.block_slices[i].offset ==
                    reinterpret_cast<uint64_t>(destination.spans[i].data()) &&
                d.block_slices[i].length == destination.spans[i].size();
      }
      if (!exact) ++bad_descriptors_;
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (described && fail_described_) {
        out[i].unsettled = true;  // the node died with this key's put possibly in flight
        continue;
      }
      auto it = objects_.find(keys[i]);
      if (down_ || it == objects_.end() || it->second.meta.fingerprint != fingerprint ||
          it->second.value.size() != destination.spans[i].size()) {
        continue;
      }
      std::memcpy(destination.spans[i].data(), it->second.value.data(), it->second.value.size());
      out[i].found = true;
      out[i].meta = it->second.meta;
      out[i].by_transport = described;
    }
    return out;
  }
  kv::ExistsResult Exists(absl::Span<const Hash128> keys, const Hash128& fingerprint) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++exists_;
    kv::ExistsResult r;
    for (const Hash128& k : keys) {
      auto it = objects_.find(k);
      r.present.push_back(!down_ && it != objects_.end() &&
                          it->second.meta.fingerprint == fingerprint);
      r.retention_floor_s.push_back(r.present.back() ? it->second.meta.retention_floor_s : 0);
    }
    while (r.prefix < static_cast<int64_t>(r.present.size()) && r.present[r.prefix]) ++r.prefix;
    return r;
  }
  int64_t Delete(absl::Span<const Hash128> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t n = 0;
    for (const Hash128& k : keys) n += static_cast<int64_t>(objects_.erase(k));
    return n;
  }
  std::vector<int> NodesFor(const Hash128&) const override { return {0}; }
  std::vector<kv::NodeStatus> nodes() const override { return {}; }

  void Hold(bool held) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_ = held;
    }
    cv_.notify_all();
  }
  // Reads with a descriptor fail: every key a miss whose span may still be written.
  void FailDescribedReads(bool fail) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_described_ = fail;
  }
  int described_gets() {
    std::lock_guard<std::mutex> lock(mu_);
    return described_gets_;
  }
  int bad_descriptors() {
    std::lock_guard<std::mutex> lock(mu_);
    return bad_descriptors_;
  }
  void SetDown(bool down) {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = down;
  }
  std::map<Hash128, Object> objects() {
    std::lock_guard<std::mutex> lock(mu_);
    return objects_;
  }
  void Set(const Hash128& key, Object o) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_[key] = std::move(o);
  }
  int puts() {
    std::lock_guard<std::mutex> lock(mu_);
    return puts_;
  }
  // Waits (up to 30 s) until `n` Puts have been called (a held one counts once it waits).
  bool WaitForPuts(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return puts_ >= n; });
  }
  int gets() {
    std::lock_guard<std::mutex> lock(mu_);
    return gets_;
  }
  int exists() {
    std::lock_guard<std::mutex> lock(mu_);
    return exists_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Hash128, Object> objects_;
  bool held_ = false, down_ = false, fail_described_ = false;
  int puts_ = 0, gets_ = 0, exists_ = 0, described_gets_ = 0, bad_descriptors_ = 0;
};

constexpr int32_t kBlockTokens = 16;

// An engine on the synthetic dense model, its thread running.
struct TestEngine {
  explicit TestEngine(int64_t blocks = 64) {
    backend = *CpuBackend::Create({1, std::nullopt});
    model = *Transformer::Create(SyntheticModel({"llama_gqa_f32"}), backend.get());
    allocator = std::make_unique<BackendKvAllocator>(backend.get());
    pool = *KvBlockPool::Create(model->KvLayoutFor(kBlockTokens), blocks, allocator.get(),
                                backend.get());
    engine = *Engine::Create(model.get(), pool.get(), nullptr, EngineOptions{});
    engine->Start();
  }
  ~TestEngine() { engine.reset(); }

  // Runs `r` to its end; its tokens.
  std::vector<TokenId> Run(EngineRequest r) {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<TokenId> tokens;
    bool done = false;
    r.on_event = [&](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e.has_token) tokens.push_back(e.token);
      imported_tokens = e.imported_tokens;
      cached_tokens = e.cached_tokens;
      if (e.finish != FinishReason::kNone) done = true;
      cv.notify_all();
    };
    EXPECT_TRUE(engine->Submit(std::move(r)).ok());
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; }));
    return tokens;
  }

  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<BackendKvAllocator> allocator;
  std::unique_ptr<KvBlockPool> pool;
  std::unique_ptr<Engine> engine;
  int64_t imported_tokens = 0, cached_tokens = 0;
};

EngineRequest Req(const std::string& id, const std::vector<TokenId>& prompt) {
  EngineRequest r;
  r.id = id;
  r.prompt = prompt;
  r.max_tokens = 6;
  r.sampling.temperature = 0;
  return r;
}

std::vector<TokenId> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> p(n);
  for (TokenId& t : p) t = static_cast<TokenId>(rng() % 97);
  return p;
}

// Reads `prompt`'s prefix with `reader`; the request it hands back (what the read said in *what).
EngineRequest ReadPrefix(StoreReader& reader, const std::vector<TokenId>& prompt, StoreRead* what,
                         StoreHint hint = {}) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  EngineRequest out;
  reader.Read(
      Req("r", prompt), absl::InfiniteFuture(),
      [&](EngineRequest r, const StoreRead& w) {
        std::lock_guard<std::mutex> lock(mu);
        out = std::move(r);
        *what = w;
        done = true;
        cv.notify_all();
      },
      hint);
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done; }));
  return out;
}

class StoreTest : public ::testing::Test {
 protected:
  StoreTest() : metrics_(registry_) {}

  // Computes `prompt` on `e` with a writer on `client` (class agent), waits for the writes.
  void Write(TestEngine& e, kv::KvClient* client, const std::vector<TokenId>& prompt,
             const StoreWriterOptions& options = {}) {
    StoreWriter writer(client, e.pool.get(), e.model->fingerprint(), &metrics_, options);
    EngineRequest r = Req("w", prompt);
    r.on_computed_blocks = [&](absl::Span<const ComputedBlock> b) {
      writer.Offer(b, kv::TrafficClass::kAgent);
    };
    e.Run(std::move(r));
    ASSERT_TRUE(writer.Flush(absl::Seconds(30)));
  }

  // ferry_worker_store_write_blocks_total{outcome}.
  double WriteBlocks(const std::string& outcome) {
    for (const auto& family : registry_.Collect()) {
      if (family.name != "ferry_worker_store_write_blocks_total") continue;
      for (const auto& metric : family.metric) {
        for (const auto& l : metric.label) {
          if (l.name == "outcome" && l.value == outcome) return metric.counter.value;
        }
      }
    }
    return -1;
  }

  prometheus::Registry registry_;
  WorkerMetrics metrics_;
};

TEST_F(StoreTest, TheWriterStoresComputedBlocksOnceAndGivesEveryReferenceBack) {
  TestEngine e;
  FakeKvClient store;
  const std::vector<TokenId> prompt = Prompt(70, 1);  // 70 + 6 tokens: 75 positions, 4 blocks
  Write(e, &store, prompt);
  const std::vector<Hash128> chain =
      ComputeBlockHashes({e.model->fingerprint(), "", ""}, prompt, kBlockTokens);
  auto objects = store.objects();
  ASSERT_EQ(objects.size(), 4u);
  const KvBlockLayout& layout = e.pool->layout();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(objects.count(chain[i])) << i;
    const FakeKvClient::Object& o = objects[chain[i]];
    EXPECT_EQ(o.meta.fingerprint, e.model->fingerprint());
    EXPECT_EQ(o.meta.layout_tag, layout.Tag());
    EXPECT_EQ(o.meta.token_count, 16u);
    EXPECT_EQ(o.meta.traffic_class, kv::TrafficClass::kAgent);
    EXPECT_EQ(o.value.size(), layout.block_bytes());
  }
  // The bytes are the engine's: the same prompt's cached block 0 holds them.
  auto reserved = std::make_shared<absl::StatusOr<KvReservation>>();
  std::mutex mu;
  std::condition_variable cv;
  e.engine->ReserveImport({chain[0]}, 1, [&](absl::StatusOr<KvReservation> r) {
    std::lock_guard<std::mutex> lock(mu);
    *reserved = std::move(r);
    cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return reserved->ok(); });
  }
  ASSERT_EQ((*reserved)->cached_blocks, 1);
  std::string bytes(layout.block_bytes(), '\0');
  ASSERT_TRUE(e.pool->ExportToHost((*reserved)->blocks, bytes.data(), bytes.size()).ok());
  EXPECT_EQ(bytes, objects[chain[0]].value);
  ASSERT_TRUE(e.pool->Release((*reserved)->blocks).ok());

  // Computed again (the engine's cache cleared): written or present lately, nothing is put; a
  // writer that never saw them finds them present.
  const int puts = store.puts();
  e.engine->ClearPrefixCache();
  Write(e, &store, prompt);
  EXPECT_EQ(store.puts(), puts);
  // Every reference the writers took went back: only the prefix cache holds blocks.
  e.engine->ClearPrefixCache();
  e.Run(Req("nothing", {1}));
  EXPECT_EQ(e.pool->num_free(), e.pool->num_blocks());
}

TEST_F(StoreTest, AHigherFloorWritesAPresentBlockAgainALowerOrEqualOneDoesNot) {
  TestEngine e;
  FakeKvClient store;
  StoreWriter writer(&store, e.pool.get(), e.model->fingerprint(), &metrics_, {});
  std::vector<BlockId> blocks = *e.pool->Allocate(3);  // as computed blocks, one reference each
  const std::vector<ComputedBlock> computed = {{0, Hash128{9, 0}, blocks[0]},
                                               {1, Hash128{9, 1}, blocks[1]}};
  auto offer = [&](uint32_t floor, absl::Span<const ComputedBlock> which) {
    writer.Offer(which, kv::TrafficClass::kChat, floor);
    ASSERT_TRUE(writer.Flush(absl::Seconds(30)));
  };
  auto floor_of = [&](int i) { return store.objects()[computed[i].hash].meta.retention_floor_s; };
  offer(300, computed);
  EXPECT_EQ(store.puts(), 1);
  EXPECT_EQ(floor_of(0), 300u);
  EXPECT_EQ(floor_of(1), 300u);
  EXPECT_EQ(WriteBlocks("written"), 2);
  // Written lately with 300: an equal or lower floor is not even asked about.
  const int exists = store.exists();
  offer(300, computed);
  offer(0, computed);
  EXPECT_EQ(store.exists(), exists);
  EXPECT_EQ(store.puts(), 1);
  EXPECT_EQ(WriteBlocks("present"), 4);
  // A higher one: asked (the store says 300) and written again with it.
  offer(3600, absl::MakeConstSpan(computed).subspan(0, 1));
  EXPECT_EQ(store.puts(), 2);
  EXPECT_EQ(floor_of(0), 3600u);
  EXPECT_EQ(floor_of(1), 300u);
  EXPECT_EQ(WriteBlocks("extended"), 1);
  EXPECT_EQ(WriteBlocks("written"), 2);
  offer(3600, absl::MakeConstSpan(computed).subspan(0, 1));
  EXPECT_EQ(store.puts(), 2);

  // A writer that never saw them asks the store: a floor at or below the store's is present.
  StoreWriter other(&store, e.pool.get(), e.model->fingerprint(), &metrics_, {});
  other.Offer(computed, kv::TrafficClass::kChat, 300);
  ASSERT_TRUE(other.Flush(absl::Seconds(30)));
  EXPECT_EQ(store.puts(), 2);
  // The same block twice in one batch, with 1800 and 2400 (both above the 300 known): put once,
  // with 2400. (The writer is held inside a Put of a third block while both are queued.)
  const std::vector<ComputedBlock> third = {{2, Hash128{9, 2}, blocks[2]}};
  store.Hold(true);
  other.Offer(third, kv::TrafficClass::kChat, 0);
  ASSERT_TRUE(store.WaitForPuts(3));
  other.Offer(absl::MakeConstSpan(computed).subspan(1, 1), kv::TrafficClass::kChat, 1800);
  other.Offer(absl::MakeConstSpan(computed).subspan(1, 1), kv::TrafficClass::kChat, 2400);
  store.Hold(false);
  ASSERT_TRUE(other.Flush(absl::Seconds(30)));
  EXPECT_EQ(store.puts(), 4);
  EXPECT_EQ(floor_of(1), 2400u);
  EXPECT_EQ(floor_of(0), 3600u);
  EXPECT_EQ(WriteBlocks("extended"), 2);
  EXPECT_EQ(WriteBlocks("written"), 3);
  // Every reference went back.
  for (BlockId b : blocks) EXPECT_EQ(e.pool->ref_count(b), 1);
  ASSERT_TRUE(e.pool->Release(blocks).ok());
}

TEST_F(StoreTest, AFullWriteQueueDropsAndNeverBlocks) {
  TestEngine e;
  FakeKvClient store;
  store.Hold(true);  // Puts wait
  StoreWriterOptions small;
  small.max_queued_bytes = 2 * static_cast<int64_t>(e.pool->layout().block_bytes());
  small.batch_blocks = 1;
  StoreWriter writer(&store, e.pool.get(), e.model->fingerprint(), &metrics_, small);
  std::vector<BlockId> blocks = *e.pool->Allocate(6);  // as computed blocks, one reference each
  std::vector<ComputedBlock> computed;
  for (int i = 0; i < 6; ++i)
    computed.push_back({i, Hash128{7, static_cast<uint64_t>(i)}, blocks[i]});
  writer.Offer(absl::MakeConstSpan(computed).subspan(0, 1), kv::TrafficClass::kChat);
  ASSERT_TRUE(store.WaitForPuts(1));
  // The writer is inside a Put the store holds; the caller is never held: two more fit in the
  // queue, three are dropped without a reference.
  writer.Offer(absl::MakeConstSpan(computed).subspan(1), kv::TrafficClass::kChat);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(e.pool->ref_count(blocks[i]), 2) << i;
  for (int i = 3; i < 6; ++i) EXPECT_EQ(e.pool->ref_count(blocks[i]), 1) << i;
  store.Hold(false);
  ASSERT_TRUE(writer.Flush(absl::Seconds(30)));
  EXPECT_EQ(store.objects().size(), 3u);
  for (BlockId b : blocks) EXPECT_EQ(e.pool->ref_count(b), 1);
  ASSERT_TRUE(e.pool->Release(blocks).ok());
}

TEST_F(StoreTest, AColdEngineImportsTheStoredRunAndAnswersAsTheOneThatComputedIt) {
  FakeKvClient store;
  const std::vector<TokenId> prompt = Prompt(100, 3);  // 6 full blocks before the last token
  TestEngine a;
  Write(a, &store, prompt);
  const std::vector<TokenId> want = a.Run(Req("again", prompt));

  TestEngine b;
  StoreReader reader(&store, b.engine.get(), b.pool.get(), b.model->fingerprint(), &metrics_, {});
  StoreRead what;
  EngineRequest r = ReadPrefix(reader, prompt, &what);
  EXPECT_STREQ(what.result, "hit");
  EXPECT_EQ(what.blocks, 6);
  EXPECT_EQ(r.imported_blocks.size(), 6u);
  EXPECT_EQ(r.imported_cached_blocks, 0);
  EXPECT_EQ(b.Run(std::move(r)), want);
  EXPECT_EQ(b.imported_tokens, 96);

  // Now b's memory has them: nothing is read.
  const int gets = store.gets();
  r = ReadPrefix(reader, prompt, &what);
  EXPECT_STREQ(what.result, "memory");
  EXPECT_TRUE(r.imported_blocks.empty());
  EXPECT_EQ(store.gets(), gets);

  // Another engine, and block 3 of another layout: the run ends before it; the blocks reserved
  // for 3.. go back.
  const std::vector<Hash128> chain =
      ComputeBlockHashes({b.model->fingerprint(), "", ""}, prompt, kBlockTokens);
  FakeKvClient::Object foreign = store.objects()[chain[3]];
  foreign.meta.layout_tag ^= 1;
  store.Set(chain[3], foreign);
  TestEngine c;
  StoreReader reader_c(&store, c.engine.get(), c.pool.get(), c.model->fingerprint(), &metrics_, {});
  r = ReadPrefix(reader_c, prompt, &what);
  EXPECT_EQ(r.imported_blocks.size(), 3u);
  EXPECT_EQ(c.pool->num_free(), c.pool->num_blocks() - 3);
  EXPECT_EQ(c.Run(std::move(r)), want);
  EXPECT_EQ(c.imported_tokens, 48);

  // A store that is down is a miss.
  store.SetDown(true);
  TestEngine d;
  StoreReader reader_d(&store, d.engine.get(), d.pool.get(), d.model->fingerprint(), &metrics_, {});
  r = ReadPrefix(reader_d, prompt, &what);
  EXPECT_STREQ(what.result, "miss");
  EXPECT_TRUE(r.imported_blocks.empty());
  EXPECT_EQ(d.pool->num_free(), d.pool->num_blocks());
}

TEST_F(StoreTest, TheRoutersProbeSparesTheExistenceCheckAndAStaleOneIsAMiss) {
  FakeKvClient store;
  const std::vector<TokenId> prompt = Prompt(100, 6);  // 6 full blocks before the last token
  TestEngine a;
  Write(a, &store, prompt);
  const std::vector<TokenId> want = a.Run(Req("again", prompt));
  const int asked = store.exists();  // (the writer's)

  // The router found all 6: read without asking.
  TestEngine b;
  StoreReader reader(&store, b.engine.get(), b.pool.get(), b.model->fingerprint(), &metrics_, {});
  StoreRead what;
  EngineRequest r = ReadPrefix(reader, prompt, &what, StoreHint{6, 6});
  EXPECT_STREQ(what.result, "hit");
  EXPECT_EQ(what.blocks, 6);
  EXPECT_EQ(store.exists(), asked);
  EXPECT_EQ(b.Run(std::move(r)), want);

  // It found 2 of 6: two are read, still without asking.
  TestEngine c;
  StoreReader reader_c(&store, c.engine.get(), c.pool.get(), c.model->fingerprint(), &metrics_, {});
  r = ReadPrefix(reader_c, prompt, &what, StoreHint{6, 2});
  EXPECT_EQ(what.blocks, 2);
  EXPECT_EQ(store.exists(), asked);
  EXPECT_EQ(c.Run(std::move(r)), want);

  // The store evicted blocks 3.. since the router asked: the run ends there, the rest is
  // computed, and the answer is the same.
  const std::vector<Hash128> chain =
      ComputeBlockHashes({a.model->fingerprint(), "", ""}, prompt, kBlockTokens);
  std::map<Hash128, FakeKvClient::Object> kept = store.objects();
  FakeKvClient evicted;
  for (int i = 0; i < 3; ++i) evicted.Set(chain[i], kept[chain[i]]);
  TestEngine d;
  StoreReader reader_d(&evicted, d.engine.get(), d.pool.get(), d.model->fingerprint(), &metrics_,
                       {});
  r = ReadPrefix(reader_d, prompt, &what, StoreHint{6, 6});
  EXPECT_EQ(what.blocks, 3);
  EXPECT_EQ(evicted.exists(), 0);
  EXPECT_EQ(d.Run(std::move(r)), want);
  EXPECT_EQ(d.imported_tokens, 48);  // 3 blocks read, the rest computed

  // Every block it asked about was there, and this chain is longer (a resumed request's output):
  // the reader asks about the rest only.
  TestEngine e;
  StoreReader reader_e(&store, e.engine.get(), e.pool.get(), e.model->fingerprint(), &metrics_, {});
  r = ReadPrefix(reader_e, prompt, &what, StoreHint{4, 4});
  EXPECT_EQ(what.blocks, 6);
  EXPECT_EQ(store.exists(), asked + 1);
  EXPECT_EQ(e.Run(std::move(r)), want);

  // No hint: the reader asks.
  TestEngine f;
  StoreReader reader_f(&store, f.engine.get(), f.pool.get(), f.model->fingerprint(), &metrics_, {});
  r = ReadPrefix(reader_f, prompt, &what);
  EXPECT_EQ(what.blocks, 6);
  EXPECT_EQ(store.exists(), asked + 2);
}

TEST_F(StoreTest, WithTheSimulatedEngineAReadTakesAtLeastItsModeledTime) {
  FakeKvClient store;
  const std::vector<TokenId> prompt = Prompt(100, 5);  // 6 full blocks: 96 tokens
  TestEngine a;
  Write(a, &store, prompt);
  SimCalibration slow;
  slow.kv_bytes_per_token = 1000;
  slow.store_read_bytes_per_s = 1e6;  // 96 kB: 96 ms
  slow.store_latency_s = 0.05;
  StoreReaderOptions options;
  options.sim_timing = std::make_shared<const SimTiming>(slow);
  const double modeled = options.sim_timing->StoreReadSeconds(96);
  EXPECT_NEAR(modeled, 0.146, 1e-9);
  TestEngine b;
  StoreReader reader(&store, b.engine.get(), b.pool.get(), b.model->fingerprint(), &metrics_,
                     options);
  StoreRead what;
  const auto start = std::chrono::steady_clock::now();
  EngineRequest r = ReadPrefix(reader, prompt, &what);
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
            modeled);
  EXPECT_STREQ(what.result, "hit");
  EXPECT_EQ(what.blocks, 6);
  EXPECT_GE(what.seconds, modeled);
  EXPECT_EQ(b.Run(std::move(r)), a.Run(Req("again", prompt)));
}

TEST_F(StoreTest, AFullReadQueueAndAPastDeadlineSkipTheRead) {
  FakeKvClient store;
  TestEngine e;
  StoreReaderOptions none;
  none.max_queued = 0;
  StoreReader reader(&store, e.engine.get(), e.pool.get(), e.model->fingerprint(), &metrics_, none);
  bool ran = false;
  reader.Read(Req("r", Prompt(100, 4)), absl::InfiniteFuture(),
              [&](EngineRequest r, const StoreRead& w) {
                ran = true;  // on this thread: the queue takes nothing
                EXPECT_STREQ(w.result, "skipped");
                EXPECT_TRUE(r.imported_blocks.empty());
              });
  EXPECT_TRUE(ran);

  StoreReader late(&store, e.engine.get(), e.pool.get(), e.model->fingerprint(), &metrics_, {});
  std::mutex mu;
  std::condition_variable cv;
  const char* result = nullptr;
  late.Read(Req("r", Prompt(100, 4)), absl::InfinitePast(), [&](EngineRequest, const StoreRead& w) {
    std::lock_guard<std::mutex> lock(mu);
    result = w.result;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return result != nullptr; }));
  EXPECT_STREQ(result, "skipped");
  EXPECT_EQ(store.gets(), 0);
}

// The pool as if registered with `transport` (the reader only describes it).
StoreReaderOptions ByTransport(const transfer::KvTransport* transport, const KvBlockPool& pool,
                               absl::Duration quarantine, Clock* clock = nullptr) {
  StoreReaderOptions options;
  options.clock = clock;
  options.transport = transport;
  options.pool_region.address = reinterpret_cast<uint64_t>(pool.region().address);
  options.pool_region.length = pool.region().length;
  options.pool_region.remote_key = "key";
  options.unsettled_quarantine = quarantine;
  return options;
}

// Counter `name`{label=value} in `registry`, or -1.
double Counter(prometheus::Registry& registry, const std::string& name, const std::string& label,
               const std::string& value) {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& metric : family.metric) {
      for (const auto& l : metric.label) {
        if (l.name == label && l.value == value) return metric.counter.value;
      }
    }
  }
  return -1;
}

TEST_F(StoreTest, ReadsByTheTransportDescribeTheBlocksAndAFailedNodesBlocksWaitOutTheQuarantine) {
  FakeKvClient store;
  const std::vector<TokenId> prompt = Prompt(100, 5);  // 6 full blocks
  TestEngine a;
  Write(a, &store, prompt);
  const std::vector<TokenId> want = a.Run(Req("again", prompt));
  transfer::TransportOptions grpc;
  grpc.kind = "grpc";
  auto transport = transfer::KvTransport::Create(grpc);
  ASSERT_TRUE(transport.ok()) << transport.status();

  TestEngine b;
  StoreReader reader(&store, b.engine.get(), b.pool.get(), b.model->fingerprint(), &metrics_,
                     ByTransport(transport->get(), *b.pool, absl::Seconds(1)));
  EXPECT_TRUE(reader.by_transport());
  StoreRead what;
  EngineRequest r = ReadPrefix(reader, prompt, &what);
  EXPECT_STREQ(what.result, "hit");
  EXPECT_TRUE(what.by_transport);
  EXPECT_EQ(what.blocks, 6);
  EXPECT_GT(store.described_gets(), 0);
  EXPECT_EQ(store.bad_descriptors(), 0);
  EXPECT_EQ(b.Run(std::move(r)), want);
  EXPECT_EQ(Counter(registry_, "ferry_worker_store_reads_total", "path", "transport"), 1);
  EXPECT_EQ(Counter(registry_, "ferry_worker_store_reads_total", "path", "stream"), 0);

  // The node fails during the read: a miss, and the six blocks it may still write stay out of
  // the pool until the quarantine ends (a second from the read's end), then all come back.
  store.FailDescribedReads(true);
  TestEngine c;
  const absl::Duration quarantine = absl::Seconds(1);
  FakeClock clock;
  {
    StoreReader failing(&store, c.engine.get(), c.pool.get(), c.model->fingerprint(), &metrics_,
                        ByTransport(transport->get(), *c.pool, quarantine, &clock));
    r = ReadPrefix(failing, prompt, &what);
    EXPECT_STREQ(what.result, "miss");
    EXPECT_EQ(what.quarantined, 6);
    EXPECT_TRUE(r.imported_blocks.empty());
    EXPECT_EQ(failing.quarantined_blocks(), 6);
    EXPECT_EQ(c.pool->num_free(), c.pool->num_blocks() - 6);
    // Computed without the store, in other blocks.
    EXPECT_EQ(c.Run(std::move(r)), want);
    EXPECT_EQ(c.imported_tokens, 0);
    EXPECT_EQ(Counter(registry_, "ferry_worker_store_read_blocks_total", "outcome", "unsettled"),
              6);
    // Held until the time is up, given back then.
    clock.Advance(quarantine - absl::Milliseconds(1));
    EXPECT_EQ(failing.quarantined_blocks(), 6);
    clock.Advance(absl::Milliseconds(1));
    EXPECT_EQ(failing.quarantined_blocks(), 0);
  }

  // A reader destroyed during a quarantine waits it out before its blocks go back.
  TestEngine d;
  {
    StoreReader failing(&store, d.engine.get(), d.pool.get(), d.model->fingerprint(), &metrics_,
                        ByTransport(transport->get(), *d.pool, absl::Milliseconds(300)));
    r = ReadPrefix(failing, prompt, &what);
    EXPECT_EQ(what.quarantined, 6);
  }
  EXPECT_EQ(d.pool->num_free(), d.pool->num_blocks());
}

}  // namespace
}  // namespace ferry
