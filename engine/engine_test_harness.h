// A test harness for the engine on synthetic models (engine_test, engine_image_test): a CPU
// backend, a Transformer, a KV block pool (and, for hybrid models, a window pool of its own), an
// Engine over them, and what each request's choices produced (tokens, the logits each was chosen
// from, finish, cache and replay counts), collected from its TokenEvents. Tests only; one thread.

#ifndef FERRY_ENGINE_ENGINE_TEST_HARNESS_H_
#define FERRY_ENGINE_ENGINE_TEST_HARNESS_H_

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/backends/cpu/cpu_backend.h"
#include "engine/engine.h"
#include "engine/model/synthetic_model.h"
#include "engine/model/transformer.h"
#include "gtest/gtest.h"

namespace ferry {
namespace engine_testing {

struct Output {
  std::vector<TokenId> tokens;
  std::vector<std::vector<float>> logits;
  FinishReason finish = FinishReason::kNone;
  SamplerState sampler_state;
  std::vector<BlockId> blocks, window_blocks;
  int64_t first_token_step = -1;
  bool stop_token = false;
  int64_t cached_tokens = 0, imported_tokens = 0, replayed_tokens = 0;
  bool approximate_kv = false;
  int64_t window_floor = 0;
  absl::Duration queued;
  int finishes = 0;
  std::string error;  // the finishing event's (kError)
  absl::StatusCode error_code = absl::StatusCode::kOk;
};

class Harness {
 public:
  // window_blocks > 0: the window layers in a pool of their own of that many blocks.
  // eos: the model's end-of-sequence ids (ModelConfig::eos_token_ids).
  Harness(const SyntheticVariant& variant, int64_t blocks, EngineOptions options,
          int32_t block_tokens = 16, int64_t window_blocks = 0, std::vector<TokenId> eos = {}) {
    backend_ = *CpuBackend::Create({2, std::nullopt});
    HostWeights weights = SyntheticModel(variant);
    weights.config.eos_token_ids = std::move(eos);
    model_ = *Transformer::Create(weights, backend_.get());
    allocator_ = std::make_unique<BackendKvAllocator>(backend_.get());
    if (window_blocks == 0) {
      pool_ = *KvBlockPool::Create(model_->KvLayoutFor(block_tokens), blocks, allocator_.get(),
                                   backend_.get());
    } else {
      pool_ = *KvBlockPool::Create(model_->FullKvLayoutFor(block_tokens), blocks, allocator_.get(),
                                   backend_.get());
      window_pool_ = *KvBlockPool::Create(model_->WindowKvLayoutFor(block_tokens), window_blocks,
                                          allocator_.get(), backend_.get());
    }
    auto engine = Engine::Create(model_.get(), pool_.get(), nullptr, options, window_pool_.get());
    EXPECT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
  }
  ~Harness() { engine_.reset(); }

  absl::Status Submit(EngineRequest r) {
    const std::string id = r.id;
    r.keep_logits = true;
    r.on_event = [this, id](const TokenEvent& e) {
      Output& o = outputs_[{id, e.choice}];
      if (e.has_token) {
        if (o.tokens.empty()) o.first_token_step = steps_;
        o.tokens.push_back(e.token);
        o.logits.push_back(e.logits);
      }
      if (e.finish != FinishReason::kNone) {
        o.finish = e.finish;
        o.sampler_state = e.sampler_state;
        o.blocks = e.blocks;
        o.window_blocks = e.window_blocks;
        o.stop_token = e.stop_token;
        o.error = e.error;
        o.error_code = e.error_code;
        ++o.finishes;
      }
      o.cached_tokens = e.cached_tokens;
      o.imported_tokens = e.imported_tokens;
      o.replayed_tokens = e.replayed_tokens;
      o.approximate_kv = e.approximate_kv;
      o.window_floor = e.window_floor;
      o.queued = e.queued;
    };
    return engine_->Submit(std::move(r));
  }
  // Steps until nothing is left to do.
  void Drain(int64_t limit = 100000) {
    for (int64_t i = 0; i < limit; ++i, ++steps_) {
      auto worked = engine_->Step();
      ASSERT_TRUE(worked.ok()) << worked.status();
      if (window_pool_ != nullptr) {
        window_peak_ =
            std::max(window_peak_, window_pool_->num_blocks() - window_pool_->num_free() -
                                       engine_->stats().window_cached_blocks);
      }
      if (!*worked) return;
    }
    FAIL() << "engine did not finish";
  }
  Output& out(const std::string& id, int32_t choice = 0) { return outputs_[{id, choice}]; }
  // Blocks held by anything but the prefix caches.
  int64_t held_blocks() {
    const EngineStats s = engine_->stats();
    return s.total_blocks - s.free_blocks - s.cached_blocks;
  }

  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<BackendKvAllocator> allocator_;
  std::unique_ptr<KvBlockPool> pool_, window_pool_;
  std::unique_ptr<Engine> engine_;
  int64_t window_peak_ = 0;  // window blocks held by sequences (not only the cache) after a step
  std::map<std::pair<std::string, int32_t>, Output> outputs_;
  int64_t steps_ = 0;
};

// A prompt of `n` pseudo-random tokens (< 97), named by `seed`.
inline std::vector<TokenId> Prompt(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> p(n);
  for (TokenId& t : p) t = static_cast<TokenId>(rng() % 97);
  return p;
}

// The same tokens, and bit-identical logits for each.
inline void ExpectSame(const Output& got, const Output& want, const std::string& what) {
  ASSERT_EQ(got.tokens, want.tokens) << what;
  ASSERT_EQ(got.logits.size(), want.logits.size()) << what;
  for (size_t i = 0; i < got.logits.size(); ++i) {
    ASSERT_EQ(0, std::memcmp(got.logits[i].data(), want.logits[i].data(),
                             got.logits[i].size() * sizeof(float)))
        << what << ": logits of token " << i << " differ";
  }
}

}  // namespace engine_testing
}  // namespace ferry

#endif  // FERRY_ENGINE_ENGINE_TEST_HARNESS_H_
