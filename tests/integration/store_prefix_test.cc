// The shared KV store in the request path (ARCHITECTURE.md §3 step 5), over real processes:
// ferry-kvstore and workers with --kvstore on the tiny models (and one case on SmolLM2). A worker
// writes the blocks it computes; another worker whose memory is cold (or the same one after a
// restart) reads the shared prefix from the store, reports it in cached_tokens (and
// cached_by_source.store), and answers exactly as the engine in this process does without any
// cache: dense, and hybrid (the window layers replayed exactly), aggregated and disaggregated (a
// cold prefill worker pushes what it read to the decode worker); by the node's UCX transport
// straight into the pool, or in the Get stream for a worker on another kind of transport. Faults: a
// store node SIGKILLed is a miss (requests still succeed) and hits resume once it is back on its
// directory; a corrupt object on disk is a miss, never a wrong token; a node SIGKILLed during a
// read into a worker's blocks by its KV transport is a miss, and the blocks it may still write stay
// out of the pool until the quarantine ends; two tenants never share a block; an object of another
// KV layout is a miss. A request's retention floor reaches the store with its prompt's blocks. And
// a bounded window replay answers the same split or not.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/common/block_hash.h"
#include "gtest/gtest.h"
#include "kvstore/client/kv_client.h"
#include "tests/integration/worker_test_util.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

const char kWritten[] = "ferry_worker_store_write_blocks_total{outcome=\"written\"}";
const char kLoaded[] = "ferry_worker_store_read_blocks_total{outcome=\"loaded\"}";

// A fresh directory for a store.
std::string StoreDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  return dir.string();
}

// A worker's flags for `store`. The per-call deadline is the tests' own: the default (500 ms) makes
// a call slower than that a miss, and a loaded test machine may take that long to connect.
std::vector<std::string> StoreFlags(const ServiceProcess& store) {
  return {"--kvstore=" + store.address(), "--kvstore_deadline=30s"};
}

std::vector<std::string> Plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Sampling Greedy() {
  Sampling s;
  s.ignore_eos = true;
  s.max_tokens = 12;
  return s;
}

v1::GenerateRequest Request(const std::string& id, const std::vector<TokenId>& prompt,
                            const std::string& salt = "") {
  v1::GenerateRequest r = MakeRequest(id, prompt, Greedy());
  r.mutable_request()->mutable_context()->set_cache_salt(salt);
  r.mutable_request()->mutable_context()->set_traffic_class(v1::TRAFFIC_CLASS_AGENT);
  return r;
}

// Runs `request` on `worker` and expects the engine's tokens for it (computed in this process,
// where caching changes nothing).
GenerateResult RunAndCompare(WorkerClient& worker, InProcessEngine& ref,
                             const v1::GenerateRequest& request) {
  GenerateResult got = worker.Generate(request, absl::Seconds(60));
  EXPECT_TRUE(got.status.ok()) << got.status.error_message();
  const std::vector<ChoiceOutput> want = ref.Run(request);
  EXPECT_EQ(got.choices.size(), 1u);
  if (got.choices.size() == 1 && want.size() == 1) {
    ExpectSameOutput(got.choices[0], want[0], request.request().context().request_id());
  }
  return got;
}

struct StoreCase {
  std::string name;
  std::string model;
  int64_t window_pool_bytes = 0;
  // The workers' KV goes through a staging area (a GPU worker's path, on the CPU backend).
  bool staged = false;
};

class StorePrefixTest : public ::testing::TestWithParam<StoreCase> {
 protected:
  std::vector<std::string> WorkerFlags(const ServiceProcess& store) const {
    std::vector<std::string> flags = StoreFlags(store);
    if (GetParam().window_pool_bytes > 0) {
      flags.push_back(absl::StrCat("--window_pool_bytes=", GetParam().window_pool_bytes));
    }
    if (GetParam().staged) flags.push_back("--kv_staging=always");
    return flags;
  }
};

TEST_P(StorePrefixTest, AColdWorkerReadsTheSharedPrefixAndAnswersAsWithoutIt) {
  const StoreCase& c = GetParam();
  const std::string model = TinyModel(c.model);
  auto store = StartKvStore(StoreDir("store_" + c.name));
  ASSERT_TRUE(store->ready());
  InProcessEngine ref(model, c.window_pool_bytes);
  const int64_t vocab = ref.model().config().vocab_size;
  // 100 tokens: 6 full blocks of 16 before the last token; the longer prompt shares them.
  const std::vector<TokenId> prompt = RandomPrompt(100, 1, vocab);
  const std::vector<TokenId> longer = Concat(prompt, RandomPrompt(30, 2, vocab));

  auto a = StartWorker(model, WorkerFlags(*store));
  ASSERT_TRUE(a->ready());
  WorkerClient on_a(a->address());
  GenerateResult first = RunAndCompare(on_a, ref, Request("first", prompt));
  EXPECT_EQ(first.usage.cached_tokens(), 0u);
  // Every full block it computed reaches the store: 111 positions, 6 blocks.
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, 6), 6);

  auto b = StartWorker(model, WorkerFlags(*store));
  ASSERT_TRUE(b->ready());
  WorkerClient on_b(b->address());
  GenerateResult second = RunAndCompare(on_b, ref, Request("second", longer));
  EXPECT_EQ(second.usage.prompt_tokens(), 130u);
  EXPECT_EQ(second.usage.cached_tokens(), 96u);
  EXPECT_EQ(second.usage.cached_by_source().store(), 96u);
  EXPECT_EQ(second.usage.cached_by_source().local(), 0u);
  EXPECT_EQ(MetricValue(b->admin_port(), kLoaded), 6);
  if (c.window_pool_bytes > 0) {
    // The window layers are never stored: rebuilt by an exact replay (the engine's counters
    // reach /metrics at the next load update).
    EXPECT_EQ(WaitForMetric(b->admin_port(),
                            "ferry_worker_window_cache_lookups_total{result=\"replay\"}", 1),
              1);
  }
  // b wrote what it computed beyond the prefix: 141 positions, blocks 6 and 7.
  EXPECT_EQ(WaitForMetric(b->admin_port(), kWritten, 2), 2);

  // Restarted, b's memory is empty; the store still has everything: 8 blocks now.
  b.reset();
  b = StartWorker(model, WorkerFlags(*store));
  ASSERT_TRUE(b->ready());
  WorkerClient again(b->address());
  GenerateResult third = RunAndCompare(again, ref, Request("third", longer));
  EXPECT_EQ(third.usage.cached_tokens(), 128u);
  EXPECT_EQ(third.usage.cached_by_source().store(), 128u);
  EXPECT_EQ(third.choices[0].tokens, second.choices[0].tokens);
  // Nothing was written twice: the blocks it computed are the ones the store lacked, or skipped.
  EXPECT_EQ(MetricValue(b->admin_port(), kWritten), 0);
  // Every block went with its request's class (its retention in the store).
  EXPECT_EQ(MetricValue(store->admin_port(), "ferry_kvstore_objects{class=\"agent\"}"), 8);
  EXPECT_EQ(MetricValue(store->admin_port(), "ferry_kvstore_objects{class=\"chat\"}"), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, StorePrefixTest,
                         ::testing::Values(StoreCase{"dense", "llama_gqa_bf16"},
                                           StoreCase{"hybrid_two_pools", "qwen3_hybrid", 1 << 20},
                                           StoreCase{"hybrid_two_pools_staged", "qwen3_hybrid",
                                                     1 << 20, /*staged=*/true}),
                         [](const auto& info) { return info.param.name; });

TEST(StorePrefixPdTest, AColdPrefillWorkerReadsTheStoreAndPushesToTheDecodeWorker) {
  const std::string model = TinyModel("llama_gqa_bf16");
  auto store = StartKvStore(StoreDir("store_pd"));
  ASSERT_TRUE(store->ready());
  const std::vector<std::string> kv = Plus(StoreFlags(*store), {"--transport=grpc"});
  auto p1 = StartWorker(model, Plus({"--role=prefill"}, kv));
  auto p2 = StartWorker(model, Plus({"--role=prefill"}, kv));
  auto d = StartWorker(model, Plus({"--role=decode"}, kv));
  ASSERT_TRUE(p1->ready() && p2->ready() && d->ready());
  WorkerClient prefill1(p1->address()), prefill2(p2->address()), decode(d->address());
  InProcessEngine ref(model);
  const int64_t vocab = ref.model().config().vocab_size;
  const std::vector<TokenId> prompt = RandomPrompt(100, 3, vocab);
  const std::vector<TokenId> longer = Concat(prompt, RandomPrompt(30, 4, vocab));

  PdResult first = RunPd(decode, d->address(), prefill1, Request("first", prompt));
  ASSERT_TRUE(first.prefill.ok()) << first.prefill.error_message();
  ASSERT_TRUE(first.stream.status.ok()) << first.stream.status.error_message();
  ExpectSameOutput(first.stream.choices[0], ref.Run(Request("first", prompt))[0], "first");
  // The prefill worker wrote the prompt's 6 full blocks.
  EXPECT_EQ(WaitForMetric(p1->admin_port(), kWritten, 6), 6);

  // Another prefill worker, cold: it reads the prefix from the store. The decode worker holds it
  // already (it cached what p1 pushed), so nothing of it is pushed again.
  PdResult second = RunPd(decode, d->address(), prefill2, Request("second", longer));
  ASSERT_TRUE(second.prefill.ok()) << second.prefill.error_message();
  ASSERT_TRUE(second.stream.status.ok()) << second.stream.status.error_message();
  ExpectSameOutput(second.stream.choices[0], ref.Run(Request("second", longer))[0], "second");
  const v1::Usage& usage = second.stream.usage;
  EXPECT_EQ(usage.cached_tokens(), 96u);
  EXPECT_EQ(usage.cached_by_source().store(), 96u);
  EXPECT_EQ(usage.cached_by_source().decode_local(), 96u);
  EXPECT_EQ(second.response.store_bytes_read(), 6 * ref.pool().layout().block_bytes());
  EXPECT_GT(second.response.store_read_us(), 0u);
  EXPECT_EQ(second.response.blocks_skipped(), 6u);
  EXPECT_EQ(MetricValue(p2->admin_port(), kLoaded), 6);
  EXPECT_EQ(
      MetricValue(d->admin_port(), "ferry_worker_prompt_tokens_total{source=\"decode_local\"}"),
      96);

  // A third request sharing everything: a decode worker that lacks the prefix gets all of it
  // from p2, which read it from the store and computed the rest.
  auto d2 = StartWorker(model, Plus({"--role=decode"}, kv));
  ASSERT_TRUE(d2->ready());
  WorkerClient decode2(d2->address());
  PdResult third = RunPd(decode2, d2->address(), prefill2, Request("third", longer));
  ASSERT_TRUE(third.stream.status.ok()) << third.stream.status.error_message();
  ExpectSameOutput(third.stream.choices[0], ref.Run(Request("third", longer))[0], "third");
  EXPECT_EQ(third.reservation.cached_prefix_blocks(), 0u);
  EXPECT_EQ(third.stream.usage.cached_tokens(), 128u);  // p2's memory now
  EXPECT_EQ(third.stream.usage.cached_by_source().local(), 128u);
}

TEST(StoreFaultTest, AStoreNodeKilledIsAMissAndHitsResumeWhenItIsBack) {
  const std::string model = TinyModel("llama_gqa_bf16");
  const std::string dir = StoreDir("store_killed");
  auto store = StartKvStore(dir);
  ASSERT_TRUE(store->ready());
  const int port = store->grpc_port();
  const std::vector<std::string> kv = StoreFlags(*store);
  InProcessEngine ref(model);
  const int64_t vocab = ref.model().config().vocab_size;
  auto a = StartWorker(model, kv);
  WorkerClient on_a(a->address());
  // Eight prompts of 6 blocks each in the store.
  std::vector<std::vector<TokenId>> prompts;
  for (uint32_t i = 0; i < 8; ++i) {
    prompts.push_back(RandomPrompt(100, 10 + i, vocab));
    RunAndCompare(on_a, ref, Request(absl::StrCat("w", i), prompts.back()));
  }
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, 48), 48);

  store->Signal(SIGKILL);
  EXPECT_EQ(store->WaitForExit(absl::Seconds(30)), 128 + SIGKILL);
  auto b = StartWorker(model, kv);
  WorkerClient on_b(b->address());
  const std::vector<TokenId> other = RandomPrompt(100, 20, vocab);
  GenerateResult missed = RunAndCompare(on_b, ref, Request("missed", Concat(prompts[0], other)));
  EXPECT_EQ(missed.usage.cached_tokens(), 0u) << "the node is down: a miss, not an error";

  // Back on its directory and port: its acknowledged blocks hit again (the client tries the node
  // again after its backoff and gRPC's reconnect backoff, a second or more; each attempt takes a
  // prompt the worker has not seen).
  store = StartKvStore(dir, port);
  ASSERT_TRUE(store->ready());
  uint32_t hit = 0;
  for (size_t i = 1; i < prompts.size() && hit == 0; ++i) {
    GenerateResult got =
        RunAndCompare(on_b, ref, Request(absl::StrCat("back", i), Concat(prompts[i], other)));
    hit = got.usage.cached_by_source().store();
    // Inherent: the worker's KV client backs off on real time in its own process, exposing no
    // node state, and each try uses up a prompt, so the tries are spaced.
    if (hit == 0) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  EXPECT_EQ(hit, 96u);
}

TEST(StoreFaultTest, ACorruptObjectOnDiskIsAMissNeverAWrongToken) {
  const std::string model = TinyModel("llama_gqa_bf16");
  const std::string dir = StoreDir("store_corrupt");
  auto store = StartKvStore(dir);
  ASSERT_TRUE(store->ready());
  const std::vector<std::string> kv = StoreFlags(*store);
  InProcessEngine ref(model);
  const std::vector<TokenId> prompt = RandomPrompt(100, 30, ref.model().config().vocab_size);
  auto a = StartWorker(model, kv);
  WorkerClient on_a(a->address());
  RunAndCompare(on_a, ref, Request("first", prompt));
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, 6), 6);

  // Flip bytes in the value of the segment's first object (records start at 4096, after the
  // segment header; a record's value follows its 128-byte header), under the running store.
  std::vector<fs::path> segments;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".seg") segments.push_back(entry.path());
  }
  ASSERT_EQ(segments.size(), 1u);
  const int fd = open(segments[0].c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const char garbage[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_EQ(pwrite(fd, garbage, sizeof(garbage), 4096 + 128 + 100), 8);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);

  auto b = StartWorker(model, kv);
  WorkerClient on_b(b->address());
  GenerateResult got = RunAndCompare(on_b, ref, Request("second", prompt));
  EXPECT_LT(got.usage.cached_by_source().store(), 96u);
  EXPECT_GE(MetricValue(store->admin_port(), "ferry_kvstore_corrupt_reads_total"), 1);
}

TEST(StoreFaultTest, TwoTenantsNeverShareABlock) {
  const std::string model = TinyModel("llama_gqa_bf16");
  auto store = StartKvStore(StoreDir("store_tenants"));
  ASSERT_TRUE(store->ready());
  const std::vector<std::string> kv = StoreFlags(*store);
  InProcessEngine ref(model);
  const std::vector<TokenId> prompt = RandomPrompt(100, 40, ref.model().config().vocab_size);
  auto a = StartWorker(model, kv);
  WorkerClient on_a(a->address());
  RunAndCompare(on_a, ref, Request("acme-1", prompt, "acme"));
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, 6), 6);

  auto b = StartWorker(model, kv);
  WorkerClient on_b(b->address());
  GenerateResult lab = RunAndCompare(on_b, ref, Request("lab-1", prompt, "lab"));
  EXPECT_EQ(lab.usage.cached_tokens(), 0u) << "another tenant's blocks are never read";
  EXPECT_EQ(MetricValue(b->admin_port(), kLoaded), 0);
  GenerateResult acme = RunAndCompare(on_b, ref, Request("acme-2", prompt, "acme"));
  EXPECT_EQ(acme.usage.cached_by_source().store(), 96u);
}

// The store node and the workers on one UCX transport (tcp): a read lands in the reader's pool by
// the node's puts (descriptor reads), its stream carrying headers only.
const std::vector<std::string> kUcx = {"--transport=ucx", "--ucx_tls=tcp"};
const char kByTransport[] = "ferry_worker_store_reads_total{path=\"transport\"}";
const char kByStream[] = "ferry_worker_store_reads_total{path=\"stream\"}";
const char kQuarantined[] = "ferry_worker_store_quarantined_blocks";

TEST(StoreTransportTest, AColdWorkerReadsByTheNodesTransportAndAnotherKindInTheStream) {
  const std::string model = TinyModel("llama_gqa_bf16");
  auto store = StartKvStore(StoreDir("store_ucx"), 0, kUcx);
  ASSERT_TRUE(store->ready());
  InProcessEngine ref(model);
  const int64_t vocab = ref.model().config().vocab_size;
  const std::vector<TokenId> prompt = RandomPrompt(100, 50, vocab);
  const std::vector<TokenId> longer = Concat(prompt, RandomPrompt(30, 51, vocab));
  // Its KV staged (a GPU worker's path): the writes leave from its staging area.
  auto a = StartWorker(model, Plus(Plus(StoreFlags(*store), kUcx), {"--kv_staging=always"}));
  ASSERT_TRUE(a->ready());
  WorkerClient on_a(a->address());
  RunAndCompare(on_a, ref, Request("first", prompt));
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, 6), 6);

  // A cold worker on UCX, staged too: the node puts the 6 blocks into its staging area, committed
  // into its pool once read.
  auto p = StartWorker(model, Plus(Plus(StoreFlags(*store), kUcx), {"--kv_staging=always"}));
  ASSERT_TRUE(p->ready());
  WorkerClient on_p(p->address());
  GenerateResult second = RunAndCompare(on_p, ref, Request("second", longer));
  EXPECT_EQ(second.usage.cached_by_source().store(), 96u);
  EXPECT_EQ(MetricValue(p->admin_port(), kLoaded), 6);
  EXPECT_EQ(MetricValue(p->admin_port(), kByTransport), 1);
  EXPECT_EQ(MetricValue(p->admin_port(), kByStream), 0);
  EXPECT_EQ(WaitForMetric(p->admin_port(), kWritten, 2), 2);  // blocks 6 and 7

  // A worker on the gRPC transport: the node has none of that kind, the bytes come in the stream.
  auto g = StartWorker(model, Plus(StoreFlags(*store), {"--transport=grpc"}));
  ASSERT_TRUE(g->ready());
  WorkerClient on_g(g->address());
  GenerateResult third = RunAndCompare(on_g, ref, Request("third", longer));
  EXPECT_EQ(third.usage.cached_by_source().store(), 128u);
  EXPECT_EQ(MetricValue(g->admin_port(), kByTransport), 0);
  EXPECT_EQ(MetricValue(g->admin_port(), kByStream), 1);
}

TEST(StoreTransportTest,
     ANodeKilledDuringAReadIntoTheBlocksIsAMissAndTheBlocksWaitOutTheQuarantine) {
  const std::string model = TinyModel("llama_gqa_bf16");
  const std::string hold = (fs::path(::testing::TempDir()) / "get-hold").string();
  fs::remove(hold);
  auto store =
      StartKvStore(StoreDir("store_ucx_killed"), 0, Plus(kUcx, {"--get_hold_file=" + hold}));
  ASSERT_TRUE(store->ready());
  InProcessEngine ref(model);
  const int64_t vocab = ref.model().config().vocab_size;
  const std::vector<TokenId> prompt = RandomPrompt(100, 60, vocab);
  auto a = StartWorker(model, Plus(StoreFlags(*store), kUcx));
  ASSERT_TRUE(a->ready());
  WorkerClient on_a(a->address());
  RunAndCompare(on_a, ref, Request("first", prompt));
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, 6), 6);

  // One Get for the whole run (one stream), a 3 s deadline: its blocks are held 4 s after a
  // failure (the deadline plus a second for the node's cancel grace).
  auto b = StartWorker(model, Plus({"--kvstore=" + store->address(), "--kvstore_deadline=3s",
                                    "--kvstore_read_streams=1"},
                                   kUcx));
  ASSERT_TRUE(b->ready());
  WorkerClient on_b(b->address());
  std::ofstream(hold) << "hold";
  // The node dies while it holds the read, its first put posted into b's blocks.
  std::thread killer([&] {
    EXPECT_TRUE(WaitUntil([&] {
      return store->LogTail().find("test seam: a Get into a destination holds") !=
             std::string::npos;
    }));
    store->Signal(SIGKILL);
    EXPECT_EQ(store->WaitForExit(absl::Seconds(30)), 128 + SIGKILL);
    fs::remove(hold);
  });
  const std::vector<TokenId> longer = Concat(prompt, RandomPrompt(30, 61, vocab));
  GenerateResult held = RunAndCompare(on_b, ref, Request("held", longer));
  killer.join();
  EXPECT_EQ(held.usage.cached_tokens(), 0u) << "the node died: a miss, computed";
  EXPECT_EQ(MetricValue(b->admin_port(), kLoaded), 0);
  EXPECT_EQ(
      MetricValue(b->admin_port(), "ferry_worker_store_read_blocks_total{outcome=\"unsettled\"}"),
      6);
  // The six blocks the node might still have written were not given back with the request's
  // end; they are once the quarantine is over.
  EXPECT_EQ(MetricValue(b->admin_port(), kQuarantined), 6);
  EXPECT_TRUE(WaitUntil([&] { return MetricValue(b->admin_port(), kQuarantined) == 0; }));
  // The worker goes on: another prompt, computed right (the node is gone: a miss).
  GenerateResult after = RunAndCompare(on_b, ref, Request("after", RandomPrompt(100, 62, vocab)));
  EXPECT_EQ(after.usage.cached_tokens(), 0u);
}

TEST(StoreFaultTest, AnObjectOfAnotherKvLayoutIsAMiss) {
  const std::string model = TinyModel("llama_gqa_bf16");
  auto store = StartKvStore(StoreDir("store_layout"));
  ASSERT_TRUE(store->ready());
  InProcessEngine ref(model);
  const std::vector<TokenId> prompt = RandomPrompt(100, 50, ref.model().config().vocab_size);
  // Objects under the prompt's very keys and model, whole and checksummed, but written by a
  // worker of another KV layout.
  const KvBlockLayout& layout = ref.pool().layout();
  const std::vector<Hash128> keys = ComputeBlockHashes(
      {ref.model().fingerprint(), "", ""}, absl::MakeConstSpan(prompt).subspan(0, 96), 16);
  std::mt19937 rng(7);
  std::vector<std::string> values(keys.size(), std::string(layout.block_bytes(), '\0'));
  std::vector<kv::ClientObject> objects;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (char& ch : values[i]) ch = static_cast<char>(rng());
    kv::ClientObject o;
    o.key = keys[i];
    o.meta.fingerprint = ref.model().fingerprint();
    o.meta.layout_tag = layout.Tag() ^ 1;
    o.meta.token_count = 16;
    o.value = values[i];
    objects.push_back(o);
  }
  kv::ClientOptions options;
  options.nodes = {store->address()};
  options.deadline = absl::Seconds(30);
  auto client = kv::KvClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_EQ((*client)->Put(objects), 6);

  auto b = StartWorker(model, StoreFlags(*store));
  WorkerClient on_b(b->address());
  GenerateResult got = RunAndCompare(on_b, ref, Request("r", prompt));
  EXPECT_EQ(got.usage.cached_tokens(), 0u);
  EXPECT_EQ(
      MetricValue(b->admin_port(), "ferry_worker_store_read_blocks_total{outcome=\"rejected\"}"),
      6);
}

TEST(StoreRetentionTest, ARequestsRetentionFloorGoesWithItsPromptBlocks) {
  const std::string model = TinyModel("llama_gqa_bf16");
  auto store = StartKvStore(StoreDir("store_floor"));
  ASSERT_TRUE(store->ready());
  InProcessEngine ref(model);
  // 90 tokens: blocks 0..4 hold prompt tokens only; block 5 (tokens 80..95) ends in output.
  const std::vector<TokenId> prompt = RandomPrompt(90, 60, ref.model().config().vocab_size);
  auto a = StartWorker(model, StoreFlags(*store));
  ASSERT_TRUE(a->ready());
  WorkerClient on_a(a->address());
  v1::GenerateRequest request = Request("floor", prompt);
  request.mutable_request()->mutable_context()->set_retention_floor_seconds(3600);
  GenerateResult got = RunAndCompare(on_a, ref, request);
  ASSERT_EQ(got.choices.size(), 1u);
  // 101 positions with KV: 6 full blocks.
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, 6), 6);
  const std::vector<TokenId> tokens = Concat(prompt, got.choices[0].tokens);
  ASSERT_GE(tokens.size(), 96u);
  const std::vector<Hash128> keys = ComputeBlockHashes(
      {ref.model().fingerprint(), "", ""}, absl::MakeConstSpan(tokens).subspan(0, 96), 16);
  kv::ClientOptions options;
  options.nodes = {store->address()};
  options.deadline = absl::Seconds(30);
  auto client = kv::KvClient::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();
  const kv::ExistsResult e = (*client)->Exists(keys, ref.model().fingerprint());
  EXPECT_EQ(e.prefix, 6);
  EXPECT_EQ(e.retention_floor_s, (std::vector<uint32_t>{3600, 3600, 3600, 3600, 3600, 0}));
}

// A hybrid model whose window cache keeps nothing replays every cached prefix; in bounded mode
// (4 of the 7 positions an exact replay needs) the answer is an approximation, and the same one
// whether one worker runs it or a prefill worker hands it to a decode worker (the window floor
// travels with the KV).
TEST(SwaReplayTest, ABoundedReplayAnswersTheSameSplitOrNot) {
  const std::string model = TinyModel("qwen3_hybrid");
  const std::vector<std::string> flags = {"--window_pool_bytes=1MiB", "--window_cache_bytes=0",
                                          "--swa_replay=bounded", "--swa_replay_tokens=4"};
  auto agg = StartWorker(model, flags);
  auto p = StartWorker(model, Plus({"--role=prefill", "--transport=grpc"}, flags));
  auto d = StartWorker(model, Plus({"--role=decode", "--transport=grpc"}, flags));
  ASSERT_TRUE(agg->ready() && p->ready() && d->ready());
  WorkerClient on_agg(agg->address()), prefill(p->address()), decode(d->address());
  InProcessEngine ref(model, 1 << 20);
  const int64_t vocab = ref.model().config().vocab_size;
  const std::vector<TokenId> prompt = RandomPrompt(60, 60, vocab);
  const std::vector<TokenId> longer = Concat(prompt, RandomPrompt(20, 61, vocab));
  // The first request leaves the prompt's 3 full blocks cached (its one token's KV is never
  // computed, so both sides cache the same); the second takes them and replays 4 positions.
  v1::GenerateRequest first = Request("first", prompt);
  first.mutable_request()->mutable_sampling()->set_max_tokens(1);
  ASSERT_TRUE(on_agg.Generate(first, absl::Seconds(60)).status.ok());
  PdResult warm = RunPd(decode, d->address(), prefill, first);
  ASSERT_TRUE(warm.stream.status.ok()) << warm.stream.status.error_message();

  GenerateResult whole = on_agg.Generate(Request("second", longer), absl::Seconds(60));
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  PdResult split = RunPd(decode, d->address(), prefill, Request("second", longer));
  ASSERT_TRUE(split.prefill.ok()) << split.prefill.error_message();
  ASSERT_TRUE(split.stream.status.ok()) << split.stream.status.error_message();
  EXPECT_EQ(split.stream.choices[0].tokens, whole.choices[0].tokens);
  EXPECT_EQ(split.stream.choices[0].text, whole.choices[0].text);
  EXPECT_EQ(whole.usage.cached_tokens(), 48u);
  for (const ServiceProcess* w : {agg.get(), p.get()}) {
    EXPECT_EQ(WaitForMetric(w->admin_port(), "ferry_worker_window_replayed_tokens_total", 4), 4);
  }
  // (An approximation: the exact answer, for the record, is the engine's without any cache.)
  const std::vector<ChoiceOutput> exact = ref.Run(Request("second", longer));
  if (exact[0].tokens != whole.choices[0].tokens) {
    std::cout << "bounded replay changed the answer (as it may)\n";
  }
}

TEST(StoreSmolLm2Test, AConversationSharingTheSystemPromptIsReadFromTheStore) {
  const char* model = std::getenv("FERRY_MODEL_GGUF");
  ASSERT_NE(model, nullptr) << "FERRY_MODEL_GGUF is not set; run through ./ferry test";
  auto store = StartKvStore(StoreDir("store_smollm2"));
  ASSERT_TRUE(store->ready());
  const std::vector<std::string> flags =
      Plus(StoreFlags(*store), {"--kv_pool_bytes=64MiB", "--threads=2"});
  InProcessEngine ref(model, 0, "bf16", "bf16", 16, 64 << 20);
  const std::string system =
      "You are a careful assistant for a river-shipping company that runs barges between the "
      "ports of the Seine, the Rhine and the Danube. Customers ask about cities, rivers, ports "
      "and schedules. Answer in one or two short sentences.\n";
  const std::vector<TokenId> first = Encode(ref.tokenizer(), system + "Where is Rouen?");
  const std::vector<TokenId> second = Encode(ref.tokenizer(), system + "Where is Basel?");
  const std::vector<TokenId> shared = Encode(ref.tokenizer(), system);
  ASSERT_GT(shared.size(), 48u);
  auto a = StartWorker(model, flags);
  WorkerClient on_a(a->address());
  RunAndCompare(on_a, ref, Request("q1", first));
  const double written = static_cast<double>((first.size() + 12 - 1) / 16);
  EXPECT_EQ(WaitForMetric(a->admin_port(), kWritten, written), written);

  auto b = StartWorker(model, flags);
  WorkerClient on_b(b->address());
  GenerateResult got = RunAndCompare(on_b, ref, Request("q2", second));
  // The system prompt's full blocks (a block may end inside the question's first token).
  EXPECT_GE(got.usage.cached_by_source().store(), (shared.size() - 1) / 16 * 16);
  EXPECT_EQ(got.usage.cached_tokens(), got.usage.cached_by_source().store());
}

}  // namespace
}  // namespace ferry
