// The null model behind the real engine: its tokens depend on the whole prefix through the KV
// cache (the same alone, in a batch, chunked, from the prefix cache; different after any change
// of the prompt), it emits only its token list, and a step takes at least its configured time,
// or with the simulated engine's timing model its modeled time (or none at all: virtual time).

#include "engine/model/null_model.h"

#include <chrono>
#include <map>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

NullModelOptions Options() {
  NullModelOptions o;
  o.config.vocab_size = 500;
  o.config.max_position_embeddings = 4096;
  for (TokenId t = 10; t < 400; t += 3) o.tokens.push_back(t);
  o.seed = 3;
  return o;
}

struct NullRun {
  explicit NullRun(NullModelOptions options, EngineOptions engine_options = {}) {
    backend = *CpuBackend::Create({1, std::nullopt});
    model = *NullModel::Create(std::move(options));
    allocator = std::make_unique<BackendKvAllocator>(backend.get());
    pool = *KvBlockPool::Create(model->KvLayoutFor(16), 256, allocator.get(), backend.get());
    engine = *Engine::Create(model.get(), pool.get(), nullptr, engine_options);
  }
  void Submit(const std::string& id, std::vector<TokenId> prompt, int64_t max_tokens,
              float temperature = 0) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = 11;
    r.on_event = [this, id](const TokenEvent& e) {
      if (e.has_token) out[id].push_back(e.token);
    };
    ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  }
  void Drain() {
    while (*engine->Step()) {
    }
  }
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<NullModel> model;
  std::unique_ptr<BackendKvAllocator> allocator;
  std::unique_ptr<KvBlockPool> pool;
  std::unique_ptr<Engine> engine;
  std::map<std::string, std::vector<TokenId>> out;
};

std::vector<TokenId> Prompt(int n, TokenId salt) {
  std::vector<TokenId> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 7 + salt) % 500);
  return p;
}

TEST(NullModelTest, TokensFollowTheWholePrefixWhateverTheBatchChunkOrCache) {
  for (float temperature : {0.0f, 1.0f}) {
    NullRun alone(Options());
    alone.Submit("r", Prompt(100, 1), 30, temperature);
    alone.Drain();
    const std::vector<TokenId> want = alone.out["r"];
    ASSERT_EQ(want.size(), 30u);
    const NullModelOptions o = Options();
    for (TokenId t : want) {
      EXPECT_TRUE(std::find(o.tokens.begin(), o.tokens.end(), t) != o.tokens.end()) << t;
    }
    EngineOptions chunked;
    chunked.prefill_chunk = 7;
    chunked.max_batch_tokens = 20;
    NullRun batch(Options(), chunked);
    for (int i = 0; i < 5; ++i) batch.Submit("o" + std::to_string(i), Prompt(30 + i, 2 + i), 9);
    batch.Submit("r", Prompt(100, 1), 30, temperature);
    batch.Drain();
    EXPECT_EQ(batch.out["r"], want);
    batch.Submit("again", Prompt(100, 1), 30, temperature);  // 96 tokens from the cache
    batch.Drain();
    EXPECT_EQ(batch.out["again"], want);
    EXPECT_GE(batch.engine->stats().cached_tokens, 96);
    // A different first token changes everything after it.
    std::vector<TokenId> changed = Prompt(100, 1);
    changed[0] = 499;
    batch.Submit("changed", changed, 30, temperature);
    batch.Drain();
    EXPECT_NE(batch.out["changed"], want);
  }
}

TEST(NullModelTest, StepsTakeTheConfiguredTime) {
  NullModelOptions o = Options();
  o.prefill_tokens_per_second = 2000;  // 200 tokens: 100 ms
  o.decode_token_seconds = 0.02;       // 20 ms a token
  NullRun run(o);
  const auto start = std::chrono::steady_clock::now();
  run.Submit("r", Prompt(200, 4), 6);  // one prefill step (with the first token), 5 decodes
  run.Drain();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.out["r"].size(), 6u);
  EXPECT_GE(seconds, 0.1 + 5 * 0.02);
  EXPECT_GE(run.engine->stats().busy_seconds, 0.2);
}

TEST(NullModelTest, RefusesBadInputAndDiffersFromOtherSetups) {
  NullModelOptions o = Options();
  o.tokens = {600};
  EXPECT_FALSE(NullModel::Create(o).ok());
  auto a = *NullModel::Create(Options());
  NullModelOptions other = Options();
  other.seed = 4;
  auto b = *NullModel::Create(other);
  EXPECT_NE(a->fingerprint(), b->fingerprint());
  EXPECT_EQ(a->FullKvLayoutFor(16).num_layers, 0);
  EXPECT_EQ(NullModel::NextState(1, 2, 3), NullModel::NextState(1, 2, 3));
  EXPECT_NE(NullModel::NextState(1, 2, 3), NullModel::NextState(1, 2, 4));
}

TEST(NullModelTest, ScriptsReplyToTheLastTriggerAndStop) {
  NullModelOptions o = Options();
  o.config.eos_token_ids = {2};
  // Script 0 armed from the start; script 1 after the trigger 7 8 9 (whose reply holds its own
  // trigger: written whole, not restarted).
  o.scripts = {{{}, {100, 101, 102}}, {{7, 8, 9}, {200, 7, 8, 9, 201}}};
  NullRun run(o);
  run.Submit("plain", {5, 6, 5, 6, 40}, 10);
  run.Submit("triggered", {5, 7, 8, 9, 41, 42}, 10);
  run.Submit("overlap", {7, 7, 8, 9, 43}, 10);  // KMP: 7 7 8 9 holds 7 8 9
  run.Submit("cut", {5, 6}, 2);
  run.Drain();
  EXPECT_EQ(run.out["plain"], (std::vector<TokenId>{100, 101, 102, 2}));
  EXPECT_EQ(run.out["triggered"], (std::vector<TokenId>{200, 7, 8, 9, 201, 2}));
  EXPECT_EQ(run.out["overlap"], (std::vector<TokenId>{200, 7, 8, 9, 201, 2}));
  EXPECT_EQ(run.out["cut"], (std::vector<TokenId>{100, 101}));
  // The script is part of the model: another script, another fingerprint; bad scripts refused.
  NullModelOptions other = o;
  other.scripts[1].reply.push_back(202);
  EXPECT_NE((*NullModel::Create(o))->fingerprint(), (*NullModel::Create(other))->fingerprint());
  other.scripts[1].reply.push_back(9999);
  EXPECT_FALSE(NullModel::Create(other).ok());
  other.scripts.assign(5, NullScript{});
  EXPECT_FALSE(NullModel::Create(other).ok());
}

SimCalibration TestCalibration() {
  SimCalibration c;
  c.kv_bytes_per_token = 1000;
  c.step_overhead_s = 0.001;
  c.prefill_token_s = 0.0005;
  c.prefill_attention_s = 1e-6;
  c.decode_step_s = 0.01;
  c.decode_row_s = 0.002;
  c.decode_kv_token_s = 1e-5;
  return c;
}

TEST(NullModelTest, VirtualTimeModelsEachStepWithoutSleeping) {
  // Steps of thousands of seconds: a Forward that slept would never let this test end.
  SimCalibration slow = TestCalibration();
  slow.step_overhead_s = 5000;
  auto timing = std::make_shared<const SimTiming>(slow, 0.5);
  NullModelOptions o = Options();
  o.timing = timing;
  o.virtual_time = true;
  NullRun run(o);
  EXPECT_EQ(run.model->last_forward_seconds(), 0);
  run.Submit("a", Prompt(50, 1), 4);
  ASSERT_TRUE(*run.engine->Step());  // a's prompt
  EXPECT_DOUBLE_EQ(run.model->last_forward_seconds(), timing->StepSeconds({{0, 50}}));
  run.Submit("b", Prompt(30, 2), 4);
  ASSERT_TRUE(*run.engine->Step());  // a decodes its second token while b's prompt is computed
  EXPECT_DOUBLE_EQ(run.model->last_forward_seconds(), timing->StepSeconds({{50, 1}, {0, 30}}));
  ASSERT_TRUE(*run.engine->Step());  // both decode
  EXPECT_DOUBLE_EQ(run.model->last_forward_seconds(), timing->StepSeconds({{51, 1}, {30, 1}}));
  run.Drain();
  EXPECT_EQ(run.out["a"].size(), 4u);
  EXPECT_EQ(run.out["b"].size(), 4u);
  // Half speed: twice the calibrated time (0.5 s x 2 of overhead alone a step).
  EXPECT_GT(run.model->last_forward_seconds(), 2 * 5000 - 1);
  // The timing model changes no token.
  NullRun plain(Options());
  plain.Submit("a", Prompt(50, 1), 4);
  plain.Drain();
  EXPECT_EQ(plain.out["a"], run.out["a"]);
}

TEST(NullModelTest, RealTimeStepsLastTheModeledTime) {
  auto timing = std::make_shared<const SimTiming>(TestCalibration());
  NullModelOptions o = Options();
  o.timing = timing;
  o.decode_token_seconds = 0;  // replaced by the model anyway
  NullRun run(o);
  const auto start = std::chrono::steady_clock::now();
  run.Submit("r", Prompt(200, 4), 3);  // one prefill step (with the first token), 2 decodes
  run.Drain();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double modeled = timing->StepSeconds({{0, 200}}) + timing->StepSeconds({{200, 1}}) +
                         timing->StepSeconds({{201, 1}});
  EXPECT_EQ(run.out["r"].size(), 3u);
  EXPECT_GE(seconds, modeled);
  EXPECT_GE(run.engine->stats().busy_seconds, modeled);
  EXPECT_DOUBLE_EQ(run.model->last_forward_seconds(), timing->StepSeconds({{201, 1}}));
}

}  // namespace
}  // namespace ferry
