// The scheduler's determinism on the default model (SmolLM2-135M-Instruct, bf16 weights and KV,
// as it serves): one request alone, in a batch of 8 mixed requests, under prefill chunks of 16
// and 64, with its prefix from the cache, and resumed after k tokens gives the same tokens from
// bit-identical logits, greedy and seeded; stop strings that span token boundaries cut the text
// where a full decode would. Needs FERRY_MODEL_GGUF (set by ./ferry test).

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/common/log.h"
#include "engine/engine.h"
#include "engine/gguf/gguf_file.h"
#include "engine/model/host_weights.h"
#include "engine/model/transformer.h"
#include "engine/smollm2_test_model.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

const char* const kPrompts[] = {
    "The river rises in the hills to the north of the town and runs south through a wide valley "
    "of farms and orchards. In spring the snow melts and the water climbs the old stone walls "
    "along the quay, and the people of the town carry their goods up to the market square. "
    "Tell me what happens next:",
    "Write a short poem about the sea.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Q: What is the capital of France?\nA:",
    "Once upon a time, in a land far away, there lived a",
    "List three uses of copper:",
    "The quick brown fox",
    "In 1905, Albert Einstein published four papers that",
};

using Shared = SmolLm2TestModel;

Shared& Model() { return SharedSmolLm2(); }

struct Output {
  std::vector<TokenId> tokens;
  std::vector<std::vector<float>> logits;
  std::string text, held;
  SamplerState sampler_state;
  FinishReason finish = FinishReason::kNone;
};

class EngineRun {
 public:
  explicit EngineRun(int64_t chunk) {
    Shared& m = Model();
    allocator_ = std::make_unique<BackendKvAllocator>(m.backend.get());
    pool_ = *KvBlockPool::Create(m.model->KvLayoutFor(16), 256, allocator_.get(), m.backend.get());
    EngineOptions options;
    options.prefill_chunk = chunk;
    options.max_batch_tokens = 4 * chunk;
    engine_ = *Engine::Create(m.model.get(), pool_.get(), m.tokenizer.get(), options);
  }
  void Submit(EngineRequest r) {
    const std::string id = r.id;
    r.keep_logits = true;
    r.on_event = [this, id](const TokenEvent& e) {
      Output& o = out_[id];
      if (e.has_token) {
        o.tokens.push_back(e.token);
        o.logits.push_back(e.logits);
      }
      o.text += e.text;
      if (e.finish != FinishReason::kNone) {
        o.finish = e.finish;
        o.sampler_state = e.sampler_state;
        o.held = e.held_text;
      }
    };
    ASSERT_TRUE(engine_->Submit(std::move(r)).ok());
  }
  void Drain() {
    while (true) {
      auto worked = engine_->Step();
      ASSERT_TRUE(worked.ok()) << worked.status();
      if (!*worked) return;
    }
  }
  Output& out(const std::string& id) { return out_[id]; }
  Engine& engine() { return *engine_; }

 private:
  std::unique_ptr<BackendKvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<Engine> engine_;
  std::map<std::string, Output> out_;
};

EngineRequest Req(const std::string& id, int prompt, int64_t max_tokens, bool sampled) {
  EngineRequest r;
  r.id = id;
  r.prompt = *Model().tokenizer->Encode(kPrompts[prompt]);
  r.max_tokens = max_tokens;
  if (sampled) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.presence_penalty = 0.5f;
    r.sampling.seed = 2026;
  } else {
    r.sampling.temperature = 0;
  }
  return r;
}

void ExpectSame(const Output& got, const Output& want, const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  for (size_t i = 0; i < got.logits.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(got.logits[i].data(), want.logits[i].data(),
                             got.logits[i].size() * sizeof(float)))
        << what << ": logits of token " << i;
  }
}

class SmolLm2EngineTest : public ::testing::TestWithParam<bool> {};

TEST_P(SmolLm2EngineTest, SameTokensAloneBatchedChunkedCachedAndResumed) {
  const bool sampled = GetParam();
  const int64_t n = 24;
  EngineRun alone(512);
  alone.Submit(Req("r", 0, n, sampled));
  alone.Drain();
  const Output want = alone.out("r");
  ASSERT_EQ(want.tokens.size(), static_cast<size_t>(n));

  for (int64_t chunk : {16, 64}) {
    EngineRun batch(chunk);
    for (int i = 1; i < 8; ++i) batch.Submit(Req("o" + std::to_string(i), i, 8 + i, i % 2));
    batch.Submit(Req("r", 0, n, sampled));
    batch.Drain();
    ExpectSame(batch.out("r"), want, "batch of 8, chunk " + std::to_string(chunk));
  }

  EngineRun cached(512);
  cached.Submit(Req("warm", 0, 1, false));
  cached.Drain();
  cached.Submit(Req("r", 0, n, sampled));
  cached.Drain();
  EXPECT_GT(cached.engine().stats().cached_tokens, 0);
  ExpectSame(cached.out("r"), want, "prefix from the cache");

  EngineRun resumed(64);
  resumed.Submit(Req("head", 0, 8, sampled));
  resumed.Drain();
  const Output head = resumed.out("head");
  EngineRequest rest = Req("rest", 0, n, sampled);
  rest.resume = {ResumePoint{head.tokens, head.sampler_state, head.held}};
  resumed.Submit(std::move(rest));
  resumed.Drain();
  Output joined = head;
  const Output& tail = resumed.out("rest");
  joined.tokens.insert(joined.tokens.end(), tail.tokens.begin(), tail.tokens.end());
  joined.logits.insert(joined.logits.end(), tail.logits.begin(), tail.logits.end());
  ExpectSame(joined, want, "resumed after 8 tokens");
  // The text streamed in two parts is the text of one stream.
  EXPECT_EQ(head.text + tail.text, want.text);
}

INSTANTIATE_TEST_SUITE_P(Sampling, SmolLm2EngineTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "seeded" : "greedy"; });

TEST(SmolLm2EngineStopTest, StopStringsAcrossTokenBoundariesCutTheText) {
  EngineRun run(512);
  run.Submit(Req("full", 4, 32, false));
  run.Drain();
  const Output& full = run.out("full");
  const std::string text = *Model().tokenizer->Decode(full.tokens, /*skip_special=*/true);
  ASSERT_EQ(full.text, text);
  // A stop string made of the end of one token's text and the start of the next one's.
  size_t boundary = 0;
  std::string stop;
  for (size_t i = 4; i + 1 < full.tokens.size() && stop.empty(); ++i) {
    const std::string a =
        *Model().tokenizer->Decode(absl::MakeConstSpan(full.tokens.data(), i), true);
    if (a.size() < 3 || text.compare(0, a.size(), a) != 0 || a.size() + 3 > text.size()) continue;
    boundary = a.size();
    stop = text.substr(boundary - 2, 5);
  }
  ASSERT_FALSE(stop.empty());
  EngineRequest r = Req("stopped", 4, 32, false);
  r.stop = {stop};
  run.Submit(std::move(r));
  run.Drain();
  const Output& cut = run.out("stopped");
  EXPECT_EQ(cut.finish, FinishReason::kStop);
  EXPECT_EQ(cut.text, text.substr(0, text.find(stop))) << "stop string '" << stop << "'";
}

}  // namespace
}  // namespace ferry
